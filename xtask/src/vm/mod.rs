//! `cargo xtask vm-test [KERNEL...]`: the privileged end-to-end tests on other kernels. Each
//! kernel (Debian's newest of a series, fetched once) boots in qemu with the host's root
//! read-only over 9p, runs the test binaries built here against the gpustall built here, and
//! powers off; the results make a table of test x kernel: pass, FAIL, or degraded (passed, on
//! a kernel where gpustall had to use its documented next-best source).
//!
//! A kernel is a series (`5.10`, `6.1`, `6.12`, `7.2`), optionally with `:v1` for the cgroup v1
//! memory controller instead of v2, or `host` for the running kernel without a VM.

mod boot;
mod fetch;
mod report;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::util::{cargo, is_root, output, target_dir, workspace_root};
use report::{Outcome, Run};

/// The whole matrix, what `cargo xtask vm-test` runs without arguments.
pub const MATRIX: &[&str] = &["5.10", "5.10:v1", "6.1", "6.1:v1", "6.12", "7.2", "host"];

/// The tests that prove the kernel-dependent paths, for CI (`--tests ci`): every probe family
/// (process tree and exits, reclaim and swap-out, block I/O and its latency, OOM kill and the
/// signal), the cgroup (v1 or v2) figures, the verdict built on them, and the uprobes on the
/// CUDA driver.
pub const CI_TESTS: &[&str] = &[
    "process_tree",
    "block_io",
    "memory_pressure",
    "oom_kill",
    "verdict::the_bundled_dataloader_workload_is_the_host_memory_chain",
    "verdict::cold_direct_reads_with_plenty_of_memory_are_disk_bound",
    "gpu_wait::the_cuda_drivers_synchronising_calls_are_timed_by_uprobes",
];

/// Tests run where the memory cgroup is v1 (`SERIES:v1`): those that read the cgroup.
const CGROUP_TESTS: &[&str] = &["memory_pressure", "oom_kill", "verdict", "cgroups"];

/// Tests that need what only `cargo xtask test` provides (a venv with torch, ~4 GB, whose
/// DataLoader under emulation would take minutes; the Debian package, which installs into the
/// host's root, read-only in the guests; packages a test installs with apt, Chromium and Slurm,
/// and Slurm's daemons; rotel from PyPI): left out of the default run, run when named (with
/// `GPUSTALL_TEST_TORCH_PYTHON` exported, which reaches the guest).
const XTASK_TEST_ONLY: &[&str] = &[
    "datawait::the_torch_dataloaders_data_wait_is_its_data_time",
    "gpu_wait::a_trainer_spinning_in_cu_stream_synchronize_is_gpu_bound",
    "gpu_wait::a_data_starved_trainer_keeps_its_data_wait_verdict_with_its_gpu_waits_measured",
    "gpu_wait::a_cpu_only_trainers_gpu_waits_are_said_to_be_unmeasured",
    "identity::a_torchrun_jobs_ranks_are_named_with_their_rank_and_run",
    "deb::the_debian_package_installs_traces_and_removes_cleanly",
    "html::the_html_report_renders_in_a_real_browser",
    "slurm::a_job_run_by_a_real_slurmd_is_named_by_its_slurm_job_and_step",
    "oom_kill::a_torchrun_ranks_spawned_workers_that_outgrow_its_cgroup_are_an_oom_with_a_worker_count",
    // rotel, fetched from PyPI with pip on the host.
    "otlp::watch_sends_incidents_and_metrics_to_an_otlp_collector",
    "otlp::a_collector_that_is_not_there_costs_a_warning_and_a_counter",
    "otlp::the_opentelemetry_variables_alone_send_gzipped_metrics",
    "otlp_receivers::rotel_receives_an_otlp_log_record",
    "otlp_receivers::rotel_receives_an_otlp_gauge",
];

#[derive(clap::Args)]
pub struct Args {
    /// Kernels: 5.10, 6.1, 6.12, 7.2 (SERIES:v1 for cgroup v1), host. Default: the whole matrix.
    kernels: Vec<String>,
    /// Test binaries or BINARY::TEST names, comma-separated, or `ci` for the CI subset.
    /// Default: every test (on `:v1` kernels, those that read the memory cgroup).
    #[arg(long, value_delimiter = ',')]
    tests: Vec<String>,
    /// Minutes a kernel may take before its VM is stopped.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Write the table as Markdown here too.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// qemu, a static busybox, kmod and cpio (and the disk tools the guest uses).
fn ensure_packages() -> anyhow::Result<()> {
    let have = |tool: &str| {
        output(Command::new("sh").args(["-c", &format!("command -v {tool}")])).is_some()
    };
    let static_busybox = output(Command::new("dpkg-query").args(["-W", "busybox-static"]))
        .is_some()
        && Path::new("/bin/busybox").is_file();
    let missing: Vec<&str> = [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("depmod", "kmod"),
        ("cpio", "cpio"),
        ("mkfs.ext4", "e2fsprogs"),
        ("xz", "xz-utils"),
        ("zstd", "zstd"),
    ]
    .iter()
    .filter(|(tool, _)| !have(tool))
    .map(|&(_, p)| p)
    .chain((!static_busybox).then_some("busybox-static"))
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: vm-test: installing {}", missing.join(" "));
    crate::util::apt_install(&missing)
}

/// One test binary of the `tests` crate.
struct TestBin {
    name: String,
    exe: PathBuf,
    /// Its tests, from `--list`.
    tests: Vec<String>,
}

/// A line of cargo's `--message-format=json` about a built artifact (other lines do not parse
/// as one and are passed over).
#[derive(serde::Deserialize)]
struct Artifact {
    reason: String,
    executable: Option<String>,
    target: ArtifactTarget,
}

#[derive(serde::Deserialize)]
struct ArtifactTarget {
    kind: Vec<String>,
    name: String,
}

/// Builds gpustall, the workloads, the NVML stand-in and the test binaries; lists the tests.
fn build() -> anyhow::Result<Vec<TestBin>> {
    crate::util::build_test_programs()?;
    let out = cargo()
        .args(["test", "-p", "tests", "--no-run", "--message-format=json"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<Artifact>(line) else { continue };
        let Some(exe) = msg.executable else { continue };
        if msg.reason != "compiler-artifact"
            || msg.target.kind.first().map(String::as_str) != Some("test")
        {
            continue;
        }
        let listed = output(Command::new(&exe).args(["--list", "--format", "terse"]))
            .with_context(|| format!("{exe} --list"))?;
        let tests = listed.lines().filter_map(|l| l.strip_suffix(": test")).map(String::from);
        bins.push(TestBin { name: msg.target.name, exe: exe.into(), tests: tests.collect() });
    }
    bins.sort_by(|a, b| a.name.cmp(&b.name));
    if bins.is_empty() {
        bail!("cargo test --no-run built no test binaries of the tests crate");
    }
    Ok(bins)
}

/// The tests selected for one kernel: per binary, the tests to run (all when empty).
fn select<'a>(bins: &'a [TestBin], wanted: &[String], v1: bool) -> Vec<(&'a TestBin, Vec<String>)> {
    let wanted: Vec<String> = match wanted {
        [] if v1 => CGROUP_TESTS.iter().map(|s| s.to_string()).collect(),
        [one] if one == "ci" => CI_TESTS.iter().map(|s| s.to_string()).collect(),
        w => w.to_vec(),
    };
    bins.iter()
        .filter_map(|b| {
            // A binary run whole (every binary, or one named) runs its tests but those only
            // `cargo xtask test` can: they are run when named one by one.
            if wanted.is_empty() || wanted.contains(&b.name) {
                let only_there =
                    |t: &&String| XTASK_TEST_ONLY.contains(&&*format!("{}::{t}", b.name));
                let tests: Vec<String> =
                    b.tests.iter().filter(|t| !only_there(t)).cloned().collect();
                return (!tests.is_empty()).then_some((b, tests));
            }
            let tests: Vec<String> = wanted
                .iter()
                .filter_map(|w| w.strip_prefix(&format!("{}::", b.name)))
                .map(String::from)
                .collect();
            (!tests.is_empty()).then_some((b, tests))
        })
        .collect()
}

/// libtest arguments for a selection: every test of the binary, or exactly the named ones.
fn libtest_args(bin: &TestBin, tests: &[String]) -> Vec<String> {
    // --show-output: what passing tests print (per-kernel figures, the programs attached) is
    // in each guest's console log too, not only a failure's.
    let mut args = vec![
        "--test-threads=2".to_string(),
        "--color=never".to_string(),
        "--show-output".to_string(),
    ];
    if tests.len() < bin.tests.len() {
        args.extend(tests.iter().cloned());
        args.push("--exact".into());
    }
    args
}

fn env_for_tests() -> Vec<(String, String)> {
    let bin = target_dir().join("debug/gpustall");
    let mut env = vec![
        ("GPUSTALL_BIN".into(), bin.display().to_string()),
        ("RUST_BACKTRACE".into(), "0".into()),
    ];
    // The tests' own switches (GPUSTALL_TEST_CLASSIC_ONLY=1 ...) reach the guest: the same
    // forced paths on every kernel.
    env.extend(std::env::vars().filter(|(k, _)| k.starts_with("GPUSTALL_TEST_")));
    env
}

fn tests_cwd() -> PathBuf {
    workspace_root().join("tests").canonicalize().unwrap_or_else(|_| workspace_root().join("tests"))
}

/// The plan the guest script reads (see `xtask/vm/guest.sh`).
fn write_plan(path: &Path, selection: &[(&TestBin, Vec<String>)], v1: bool) -> anyhow::Result<()> {
    let mut plan =
        format!("cgroup\t{}\ncwd\t{}\n", if v1 { "v1" } else { "v2" }, tests_cwd().display());
    for (k, v) in env_for_tests() {
        plan.push_str(&format!("env\t{k}={v}\n"));
    }
    for (bin, tests) in selection {
        let args = libtest_args(bin, tests).join(" ");
        plan.push_str(&format!("test\t{}\t{}\t{args}\n", bin.name, bin.exe.display()));
    }
    std::fs::write(path, plan)?;
    Ok(())
}

/// Shown live while a guest runs: its progress markers and libtest's per-test lines.
fn progress_line(line: &str) -> bool {
    line.starts_with("@@")
        || (line.starts_with("test ") && line.contains(" ... "))
        || line.starts_with("test result:")
}

/// Boots `series` with the selected tests and reads their outcomes from its console.
fn run_vm(
    spec: &str,
    bins: &[TestBin],
    wanted: &[String],
    timeout: Duration,
) -> anyhow::Result<Run> {
    let (series, v1) = match spec.split_once(':') {
        Some((s, "v1")) => (s, true),
        Some((_, other)) => bail!("unknown kernel option :{other} in {spec} (only :v1)"),
        None => (spec, false),
    };
    let vm = target_dir().join("vm");
    let kernel = fetch::kernel(&vm.join("kernels"), series)?;
    let work = vm.join("runs").join(spec.replace(':', "-"));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let initrd = work.join("initrd.gz");
    boot::initrd(&kernel, &work, &initrd)?;
    let selection = select(bins, wanted, v1);
    let plan = work.join("plan");
    write_plan(&plan, &selection, v1)?;
    let guest = work.join("guest.sh");
    std::fs::write(&guest, include_str!("../../vm/guest.sh"))?;
    std::fs::set_permissions(&guest, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let disk = work.join("disk.img");
    std::fs::File::create(&disk)?.set_len(4 << 30)?;
    eprintln!(
        "xtask: vm-test: booting {} ({spec}), {} test binaries",
        kernel.release,
        selection.len()
    );
    let console = boot::boot(
        &boot::Boot {
            kernel: &kernel,
            initrd: &initrd,
            run: &guest,
            arg: &plan,
            disk: &disk,
            // cgroup v1 swap accounting (memory.memsw.*) is off by default on older kernels.
            extra_cmdline: if v1 { "swapaccount=1" } else { "" },
            timeout,
            silence: GUEST_SILENCE,
            log: &work.join("console.log"),
        },
        progress_line,
    )?;
    let _ = std::fs::remove_file(&disk);
    let mut run = report::parse(spec, &kernel.release, &console.lines, &selection_ids(&selection));
    run.wall = console.wall;
    run.log = work.join("console.log");
    for line in report::failure_report(&console.lines, 80) {
        eprintln!("  ! {line}");
    }
    if !console.finished {
        run.mark_unfinished(Outcome::Timeout);
    }
    // A guest whose kernel panicked (the int3 oops of live text patching under emulation)
    // is lost as a hung one is: booted once more.
    run.hung =
        console.hung || console.lines.iter().any(|l| l.contains("Kernel panic - not syncing"));
    Ok(run)
}

/// A guest that prints nothing this long is hung (the slowest test here prints its result
/// within about two minutes under emulation).
const GUEST_SILENCE: Duration = Duration::from_secs(6 * 60);

/// Boots `spec` and, when its guest hangs or its kernel panics, once more. Under software
/// emulation the guest kernel now and then locks up or oopses while programs attach (live
/// patching of kernel text: a soft lockup on 5.10, an int3 oops in `__schedule` or
/// `__hrtimer_run_queues` on 7.2, never seen on real hardware or on this host's kernel); the
/// retry is said in the output, and a second loss fails as any timeout does.
fn run_vm_retrying(
    spec: &str,
    bins: &[TestBin],
    wanted: &[String],
    timeout: Duration,
) -> anyhow::Result<Run> {
    let first = run_vm(spec, bins, wanted, timeout)?;
    if !first.hung {
        return Ok(first);
    }
    eprintln!(
        "xtask: vm-test: {spec}: the guest hung (nothing printed for {} s) or its kernel panicked (its console is {}): booting it once more",
        GUEST_SILENCE.as_secs(),
        first.log.display()
    );
    // Beside the run's directory, which the second boot empties.
    let kept = hung_log(&first.log);
    let _ = std::fs::copy(&first.log, &kept);
    let mut again = run_vm(spec, bins, wanted, timeout)?;
    again.retried_after_hang = true;
    Ok(again)
}

/// Where the first boot's console is kept when a guest is booted again: `runs/<kernel>/console.log`
/// to `runs/<kernel>-console-hung.log`.
fn hung_log(log: &std::path::Path) -> std::path::PathBuf {
    let dir = log.parent().unwrap_or(log);
    let name = dir.file_name().map_or_else(|| "guest".into(), |n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!("{name}-console-hung.log"))
}

fn selection_ids(selection: &[(&TestBin, Vec<String>)]) -> Vec<(String, String)> {
    selection
        .iter()
        .flat_map(|(b, tests)| tests.iter().map(|t| (b.name.clone(), t.clone())))
        .collect()
}

/// The same tests on the running kernel, without a VM.
fn run_host(bins: &[TestBin], wanted: &[String]) -> anyhow::Result<Run> {
    let start = Instant::now();
    let selection = select(bins, wanted, false);
    let work = target_dir().join("vm/runs/host");
    std::fs::create_dir_all(&work)?;
    let mut lines = Vec::new();
    for (bin, tests) in &selection {
        let degraded = work.join(format!("degraded-{}", bin.name));
        std::fs::write(&degraded, "")?;
        eprintln!("xtask: vm-test: host: {}", bin.name);
        let t0 = Instant::now();
        let out = Command::new(&bin.exe)
            .args(libtest_args(bin, tests))
            .envs(env_for_tests())
            .env("GPUSTALL_VM_DEGRADED", &degraded)
            .current_dir(tests_cwd())
            .stdin(std::process::Stdio::null())
            .output()
            .with_context(|| format!("running {}", bin.exe.display()))?;
        lines.push(format!("@@BEGIN {}", bin.name));
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        lines.extend(text.lines().map(String::from));
        let rc = out.status.code().unwrap_or(-1);
        lines.push(format!("@@END {} rc={rc} secs={:.1}", bin.name, t0.elapsed().as_secs_f64()));
        for l in std::fs::read_to_string(&degraded)?.lines() {
            lines.push(format!("@@DEGRADED {} {}", bin.name, l.replacen('\t', " ", 1)));
        }
    }
    std::fs::write(work.join("console.log"), lines.join("\n"))?;
    let release = output(Command::new("uname").arg("-r")).unwrap_or_default().trim().to_string();
    let mut run = report::parse("host", &release, &lines, &selection_ids(&selection));
    run.wall = start.elapsed();
    run.log = work.join("console.log");
    Ok(run)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if !is_root() {
        bail!("vm-test installs packages, boots VMs and runs the privileged tests: run as root");
    }
    let kernels: Vec<String> = if args.kernels.is_empty() {
        MATRIX.iter().map(|s| s.to_string()).collect()
    } else {
        args.kernels.clone()
    };
    crate::setup::run_setup(true)?;
    crate::setup::ensure_test_tools()?;
    if kernels.iter().any(|k| k != "host") {
        ensure_packages()?;
    }
    let bins = build()?;
    let start = Instant::now();
    let mut runs = Vec::new();
    for k in &kernels {
        let run = if k == "host" {
            run_host(&bins, &args.tests)?
        } else {
            run_vm_retrying(k, &bins, &args.tests, Duration::from_secs(args.timeout * 60))?
        };
        eprintln!("xtask: vm-test: {k} ({}) took {:.0} s", run.release, run.wall.as_secs_f64());
        runs.push(run);
    }
    let table = report::table(&runs, start.elapsed());
    println!("{}", table.text);
    let md = args.markdown.clone().unwrap_or_else(|| target_dir().join("vm/matrix.md"));
    std::fs::write(&md, &table.markdown)?;
    eprintln!("xtask: vm-test: the table is also in {}", md.display());
    if table.failures > 0 {
        bail!(
            "{} test runs failed (console logs: {})",
            table.failures,
            target_dir().join("vm/runs").display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{select, TestBin};

    fn bin(name: &str, tests: &[&str]) -> TestBin {
        let tests = tests.iter().map(|t| t.to_string()).collect();
        TestBin { name: name.into(), exe: format!("/t/{name}").into(), tests }
    }

    #[test]
    fn the_torch_test_is_left_out_of_a_whole_binarys_run_and_runs_when_named() {
        let torch = "the_torch_dataloaders_data_wait_is_its_data_time";
        let bins = [
            bin("datawait", &[torch, "a_pin_memory_relays_data_wait_is_the_workers"]),
            bin("oom_kill", &["x"]),
        ];
        let all = select(&bins, &[], false);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].1, ["a_pin_memory_relays_data_wait_is_the_workers"]);
        assert_eq!(all[1].1, ["x"]);
        let named = select(&bins, &[format!("datawait::{torch}")], false);
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].1, [torch]);
        // A binary named whole (CI's `oom_kill`) leaves it out too.
        assert_eq!(
            select(&bins, &["datawait".into()], false)[0].1,
            ["a_pin_memory_relays_data_wait_is_the_workers"]
        );
    }

    #[test]
    fn a_hung_guests_console_is_kept_beside_its_run_directory() {
        let log = std::path::Path::new("/t/vm/runs/5.10/console.log");
        assert_eq!(super::hung_log(log), std::path::Path::new("/t/vm/runs/5.10-console-hung.log"));
    }
}
