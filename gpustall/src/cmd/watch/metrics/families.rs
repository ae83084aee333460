//! A job's metric families, each declared once.
//!
//! A family of a job's series has four parts that must agree: its field, its registration (stem,
//! help, unit), its series made at zero when the job appears, and its removal when the job goes.
//! Spelled out, adding one family took an edit in each, and a family left out of the removal
//! would keep a finished job's series on the node for ever. Here one row of a table declares
//! it (as below's model declares a field once); the struct and the three functions are made
//! from the rows.

/// `families! { Name<Labels> { field: MetricType, "stem", unit, at_zero, "help"; ... } }` makes
/// `struct Name` with a `Family<Labels, MetricType>` per row and:
/// - `register`: each family under its stem, with its unit where it has one (`Some(Unit)`);
/// - `create`: the series of `labels` in the rows marked `at_zero`, so `increase()` and `rate()`
///   have a first sample before the first event (a counter made at 1 never fires an alert);
/// - `remove`: the series of `labels` in every row.
macro_rules! families {
    (
        $(#[$meta:meta])*
        $name:ident<$labels:ty> {
            $( $field:ident: $metric:ty, $stem:literal, $unit:expr, $at_zero:literal, $help:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Default)]
        pub(super) struct $name {
            $( pub(super) $field: prometheus_client::metrics::family::Family<$labels, $metric>, )*
        }

        impl $name {
            pub(super) fn register(&self, r: &mut prometheus_client::registry::Registry) {
                $(
                    let unit: Option<prometheus_client::registry::Unit> = $unit;
                    match unit {
                        Some(u) => r.register_with_unit($stem, $help, u, self.$field.clone()),
                        None => r.register($stem, $help, self.$field.clone()),
                    }
                )*
            }

            #[allow(dead_code, reason = "a table with no row made at zero has no use for it")]
            pub(super) fn create(&self, labels: &$labels) {
                $( if $at_zero { let _ = self.$field.get_or_create(labels); } )*
            }

            pub(super) fn remove(&self, labels: &$labels) {
                // `remove` says whether the series existed; a label set may be in some families
                // only (a gauge set without a counter added), so the answers are not interesting.
                $( self.$field.remove(labels); )*
            }
        }
    };
}

pub(super) use families;
