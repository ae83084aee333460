//! Empty: lets `gpustall` list this crate as a build-dependency so cargo rebuilds on change.
#![no_std]
