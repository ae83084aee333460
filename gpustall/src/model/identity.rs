//! Which job a process belongs to, in the words a cluster uses: the Kubernetes pod and
//! container, the Slurm job and step, the torchrun run and rank. Read from what the node
//! already has (the process's cgroup path and a short list of its environment variables,
//! `sources::identity_read`); what was not found is absent, never guessed.
//!
//! Pure parsing, unit-tested on the layouts the kubelet's cgroupfs and systemd drivers,
//! containerd, CRI-O, Docker and slurmd (cgroup v1 and v2) create.

use serde::{Deserialize, Serialize};

/// A process's identity in its cluster. Every field is optional: a plain `python train.py` on
/// a workstation has none.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// Kubernetes: the pod's UID and the container's id (from the cgroup path); the pod's
    /// name and namespace and the container's name as the kubelet names its log files, else
    /// the pod's name from the container's HOSTNAME and its namespace from the service-account
    /// namespace file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Slurm: the job and step (cgroup path, else SLURM_JOB_ID / SLURM_STEP_ID), the job's
    /// user id (v1 cgroup path, else SLURM_JOB_UID) and user name (SLURM_JOB_USER).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_user: Option<String>,
    /// torch.distributed (torchrun, accelerate, deepspeed set these): the run, this process's
    /// global and local rank, the world size, the node's rank, the rendezvous address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<String>,
}

/// The environment variables read (and only these are ever kept).
pub const ENV_VARS: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_JOB_UID",
    "SLURM_JOB_USER",
    "HOSTNAME",
];

/// The largest world size taken from a job's environment: past the largest jobs that run
/// (about 10^5 GPUs), and a merge lists the ranks it says are missing.
pub const MAX_WORLD_SIZE: u32 = 1 << 20;

/// A Kubernetes DNS-1123 label (a namespace's or a container's name): 1 to 63 of a-z, 0-9
/// and '-', starting and ending with a letter or digit. Anything else did not come from
/// Kubernetes.
pub fn is_dns_label(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter().all(|&c| alnum(c) || c == b'-')
        && alnum(b[0])
        && alnum(b[b.len() - 1])
}

/// A DNS-1123 subdomain (a pod's name): dot-separated labels, 253 bytes at most.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

impl Identity {
    pub fn is_empty(&self) -> bool {
        *self == Identity::default()
    }

    /// Whether the cgroup says the process runs in a Kubernetes pod.
    pub fn in_pod(&self) -> bool {
        self.pod_uid.is_some()
    }

    /// What the cgroup path says: a Kubernetes pod and container, or a Slurm job and step.
    pub fn from_cgroup(path: &str) -> Identity {
        let mut id = Identity::default();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            id.cgroup_part(part);
        }
        id
    }

    fn cgroup_part(&mut self, part: &str) {
        let scope = part.strip_suffix(".scope");
        let slice = part.strip_suffix(".slice");
        if let Some(uid) = pod_uid(part, slice) {
            self.pod_uid = Some(uid);
        } else if let Some(cid) = scope.and_then(container_of_scope) {
            self.container_id = Some(cid.to_string());
        } else if self.pod_uid.is_some() && self.container_id.is_none() && is_container_id(part) {
            self.container_id = Some(part.to_string());
        } else if let Some(job) = part.strip_prefix("job_") {
            self.slurm_job = Some(job.to_string());
        } else if let Some(step) = part.strip_prefix("step_").filter(|_| self.slurm_job.is_some()) {
            self.slurm_step = Some(step.to_string());
        } else if let Some(uid) = part.strip_prefix("uid_") {
            self.slurm_uid = uid.parse().ok();
        }
    }

    /// Adds what the environment says (`pairs`: the variables of [`ENV_VARS`] found). A rank
    /// at or above its world size, or a world size above [`MAX_WORLD_SIZE`], is not a job's:
    /// both are dropped (a merge lists the ranks a world size says are missing). The
    /// cgroup's Slurm job wins over the environment's; HOSTNAME names the pod only in a pod.
    pub fn with_env<'a>(mut self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut port = None;
        for (k, v) in pairs {
            let v = v.trim();
            if v.is_empty() {
                continue;
            }
            let num = v.parse::<u32>().ok();
            match k {
                "RANK" => self.rank = num,
                "LOCAL_RANK" => self.local_rank = num,
                "WORLD_SIZE" => self.world_size = num,
                "GROUP_RANK" => self.group_rank = num,
                "TORCHELASTIC_RUN_ID" => self.run_id = Some(v.to_string()),
                "MASTER_ADDR" => self.master = Some(v.to_string()),
                "MASTER_PORT" => port = Some(v.to_string()),
                "SLURM_JOB_ID" if self.slurm_job.is_none() => self.slurm_job = Some(v.to_string()),
                "SLURM_STEP_ID" if self.slurm_step.is_none() => {
                    self.slurm_step = Some(v.to_string())
                }
                "SLURM_JOB_UID" if self.slurm_uid.is_none() => self.slurm_uid = num,
                "SLURM_JOB_USER" => self.slurm_user = Some(v.to_string()),
                "HOSTNAME" if self.in_pod() => self.pod = Some(v.to_string()),
                _ => {}
            }
        }
        if let (Some(addr), Some(port)) = (&self.master, port) {
            self.master = Some(format!("{addr}:{port}"));
        }
        let world_ok = self.world_size.is_none_or(|w| (1..=MAX_WORLD_SIZE).contains(&w));
        let rank_ok = |r: Option<u32>| match (r, self.world_size) {
            (Some(r), Some(w)) => r < w,
            _ => true,
        };
        if !world_ok || !rank_ok(self.rank) {
            log::warn!(
                "RANK={:?} WORLD_SIZE={:?} is not a job's ranks (a rank below a world size of at most {MAX_WORLD_SIZE}): not used",
                self.rank,
                self.world_size
            );
            (self.rank, self.world_size) = (None, None);
        }
        self
    }

    /// Adds the names the kubelet gives a pod's and a container's log files: the directory
    /// `<namespace>_<pod>_<pod uid>` (under /var/log/pods) and the link
    /// `<pod>_<namespace>_<container>-<container id>.log` (under /var/log/containers). Neither a
    /// namespace, a pod nor a container name may hold `_`, so the split is exact. These are the
    /// API object's names and win over HOSTNAME, which a pod spec's `hostname` or `hostNetwork`
    /// makes something else.
    pub fn with_kubelet_logs<'a>(
        mut self,
        pod_dirs: impl IntoIterator<Item = &'a str>,
        container_links: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        if let Some(uid) = self.pod_uid.clone() {
            let suffix = format!("_{uid}");
            let found = pod_dirs.into_iter().find_map(|d| d.strip_suffix(&suffix)?.split_once('_'));
            if let Some((ns, pod)) =
                found.filter(|(ns, pod)| is_dns_label(ns) && is_dns_subdomain(pod))
            {
                (self.namespace, self.pod) = (Some(ns.to_string()), Some(pod.to_string()));
            }
        }
        if let Some(cid) = self.container_id.clone() {
            let suffix = format!("-{cid}.log");
            let names = |l: &'a str| {
                let mut it = l.strip_suffix(&suffix)?.splitn(3, '_');
                Some((it.next()?, it.next()?, it.next()?))
            };
            let valid = |(pod, ns, c): &(&str, &str, &str)| {
                is_dns_subdomain(pod) && is_dns_label(ns) && is_dns_label(c)
            };
            if let Some((pod, ns, container)) =
                container_links.into_iter().find_map(names).filter(valid)
            {
                self.pod = Some(pod.to_string());
                self.namespace = Some(ns.to_string());
                self.container = Some(container.to_string());
            }
        }
        self
    }

    /// The job's identity from its processes': the first value found of each field, the ranks'
    /// own fields (rank, local rank) only when one process has them (a trace of one rank).
    pub fn of_job<'a>(ids: impl IntoIterator<Item = &'a Identity>) -> Identity {
        let mut job = Identity::default();
        let mut ranks = std::collections::BTreeSet::new();
        for id in ids {
            ranks.extend(id.rank);
            fill(&mut job.pod_uid, &id.pod_uid);
            fill(&mut job.container_id, &id.container_id);
            fill(&mut job.container, &id.container);
            fill(&mut job.pod, &id.pod);
            fill(&mut job.namespace, &id.namespace);
            fill(&mut job.slurm_job, &id.slurm_job);
            fill(&mut job.slurm_step, &id.slurm_step);
            fill(&mut job.slurm_uid, &id.slurm_uid);
            fill(&mut job.slurm_user, &id.slurm_user);
            fill(&mut job.run_id, &id.run_id);
            fill(&mut job.world_size, &id.world_size);
            fill(&mut job.group_rank, &id.group_rank);
            fill(&mut job.master, &id.master);
            fill(&mut job.rank, &id.rank);
            fill(&mut job.local_rank, &id.local_rank);
        }
        if ranks.len() > 1 {
            (job.rank, job.local_rank) = (None, None);
        }
        job
    }

    /// One line for a heading: "Slurm job 4821 step 0, user alice, torchrun run abc, rank 3 of
    /// 16, pod ml-team/train-7f9c, container trainer"; `None` when nothing is known.
    pub fn label(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(job) = &self.slurm_job {
            let step = self.slurm_step.as_ref().map(|s| format!(" step {s}")).unwrap_or_default();
            parts.push(format!("Slurm job {job}{step}"));
            match (&self.slurm_user, self.slurm_uid) {
                (Some(user), _) => parts.push(format!("user {user}")),
                (None, Some(uid)) => parts.push(format!("uid {uid}")),
                (None, None) => {}
            }
        }
        if let Some(run) = &self.run_id {
            parts.push(format!("torchrun run {run}"));
        }
        match (self.rank, self.world_size) {
            (Some(r), Some(w)) => parts.push(format!("rank {r} of {w}")),
            (Some(r), None) => parts.push(format!("rank {r}")),
            (None, Some(w)) => parts.push(format!("{w} ranks")),
            (None, None) => {}
        }
        match (&self.namespace, &self.pod, &self.pod_uid) {
            (Some(ns), Some(pod), _) => parts.push(format!("pod {ns}/{pod}")),
            (None, Some(pod), _) => parts.push(format!("pod {pod}")),
            (_, None, Some(uid)) => parts.push(format!("pod uid {uid}")),
            _ => {}
        }
        parts.extend(self.container.as_ref().map(|c| format!("container {c}")));
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

impl Identity {
    /// A short name safe in a file name: "rank3", "slurm4821", "pod-train-7f9c", joined by
    /// dashes; `None` when nothing is known.
    pub fn file_tag(&self) -> Option<String> {
        let mut parts = Vec::new();
        parts.extend(self.slurm_job.as_ref().map(|j| format!("slurm{j}")));
        parts.extend(self.pod.as_ref().map(|p| format!("pod-{p}")));
        parts.extend(self.rank.map(|r| format!("rank{r}")));
        let tag: String = parts
            .join("-")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
            .take(80)
            .collect();
        (!tag.is_empty()).then_some(tag)
    }
}

fn fill<T: Clone>(into: &mut Option<T>, from: &Option<T>) {
    if into.is_none() {
        into.clone_from(from);
    }
}

/// `pod<uid>` (cgroupfs driver) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd
/// driver): the pod's UID, with dashes.
fn pod_uid(part: &str, slice: Option<&str>) -> Option<String> {
    let uid = match slice {
        Some(s) if s.starts_with("kubepods") => s.rsplit_once("-pod")?.1.replace('_', "-"),
        None => part.strip_prefix("pod")?.to_string(),
        Some(_) => return None,
    };
    let looks_like_uid = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    looks_like_uid.then_some(uid)
}

/// `cri-containerd-<id>`, `crio-<id>`, `docker-<id>` (systemd driver's scope names).
fn container_of_scope(scope: &str) -> Option<&str> {
    ["cri-containerd-", "crio-", "docker-"]
        .iter()
        .find_map(|p| scope.strip_prefix(p))
        .filter(|id| is_container_id(id))
}

/// A container runtime's id: 64 hex digits.
fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ranks_that_kubernetes_and_torchrun_could_not_have_made_are_dropped() {
        assert!(is_dns_label("kube-system") && is_dns_label("a") && is_dns_label("ns-0"));
        for bad in ["", "-a", "a-", "A", "root:$6$TOPSECRETHASH:", "a\x1b]0;x\x07", &"a".repeat(64)]
        {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
        assert!(is_dns_subdomain("train-7f9c.web") && !is_dns_subdomain("a..b"));
        let env = |rank: &'static str, world: &'static str| {
            Identity::default().with_env([("RANK", rank), ("WORLD_SIZE", world)])
        };
        assert_eq!((env("3", "4").rank, env("3", "4").world_size), (Some(3), Some(4)));
        assert_eq!((env("0", "4294967295").rank, env("0", "4294967295").world_size), (None, None));
        assert_eq!((env("4", "4").rank, env("4", "4").world_size), (None, None));
        assert_eq!(env("0", "0").world_size, None);
        // A kubelet log name with an escape is no pod's.
        let id = Identity { pod_uid: Some("u1".into()), ..Default::default() };
        let id = id.with_kubelet_logs(["ns_p\x1b[2J_u1"], []);
        assert_eq!((id.namespace, id.pod), (None, None));
    }

    const UID: &str = "8f2a4b1c-3d5e-4f60-9a7b-1c2d3e4f5a6b";
    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn kubernetes_pods_and_containers_under_each_driver_and_runtime() {
        let uscore = UID.replace('-', "_");
        for path in [
            format!("/kubepods/burstable/pod{UID}/{CID}"),
            format!("/kubepods/pod{UID}/{CID}"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uscore}.slice/cri-containerd-{CID}.scope"),
            format!("/kubepods.slice/kubepods-pod{uscore}.slice/crio-{CID}.scope"),
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uscore}.slice/docker-{CID}.scope"),
        ] {
            let id = Identity::from_cgroup(&path);
            assert_eq!(
                (id.pod_uid.as_deref(), id.container_id.as_deref()),
                (Some(UID), Some(CID)),
                "{path}"
            );
        }
    }

    #[test]
    fn slurm_jobs_and_steps_under_v1_and_v2() {
        let v1 = Identity::from_cgroup("/slurm/uid_1000/job_4821/step_0/task_0");
        assert_eq!(
            (v1.slurm_job.as_deref(), v1.slurm_step.as_deref(), v1.slurm_uid),
            (Some("4821"), Some("0"), Some(1000))
        );
        let v2 =
            Identity::from_cgroup("/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0");
        assert_eq!(
            (v2.slurm_job.as_deref(), v2.slurm_step.as_deref()),
            (Some("77"), Some("batch"))
        );
    }

    #[test]
    fn a_workstation_has_no_identity() {
        for path in
            ["/", "/user.slice/user-1000.slice/session-2.scope", "/gpustall-test-x", "/pod-x"]
        {
            assert!(Identity::from_cgroup(path).is_empty(), "{path}");
        }
    }

    #[test]
    fn torchrun_and_slurm_variables_and_a_pods_hostname() {
        let env = [
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "16"),
            ("GROUP_RANK", "1"),
            ("TORCHELASTIC_RUN_ID", "run-abc"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("SLURM_JOB_ID", "999"),
            ("SLURM_JOB_UID", "1001"),
            ("SLURM_JOB_USER", "alice"),
            ("HOSTNAME", "train-7f9c"),
        ];
        let id = Identity::from_cgroup("/slurm/uid_0/job_4821/step_0").with_env(env);
        assert_eq!(
            (id.rank, id.local_rank, id.world_size, id.group_rank),
            (Some(3), Some(1), Some(16), Some(1))
        );
        assert_eq!(id.master.as_deref(), Some("10.0.0.1:29500"));
        assert_eq!(id.slurm_job.as_deref(), Some("4821"), "the cgroup's job wins");
        assert_eq!(id.slurm_uid, Some(0), "and its user id");
        assert_eq!(id.slurm_user.as_deref(), Some("alice"));
        assert_eq!(id.pod, None, "HOSTNAME is a pod's name only in a pod");
        assert_eq!(
            id.label().as_deref(),
            Some("Slurm job 4821 step 0, user alice, torchrun run run-abc, rank 3 of 16")
        );
        // cgroup v2: no user id in the path; Slurm's variables give it.
        let v2 = Identity::from_cgroup("/system.slice/slurmstepd.scope/job_77/step_0/user/task_0")
            .with_env([("SLURM_JOB_UID", "1001")]);
        assert_eq!(v2.slurm_uid, Some(1001));
        assert_eq!(v2.label().as_deref(), Some("Slurm job 77 step 0, uid 1001"));
        let pod = Identity::from_cgroup(&format!("/kubepods/pod{UID}/{CID}"))
            .with_env([("HOSTNAME", "train-7f9c")]);
        assert_eq!(pod.pod.as_deref(), Some("train-7f9c"));
    }

    #[test]
    fn the_kubelets_log_names_name_the_pod_and_container_over_hostname() {
        let cgroup = format!("/kubepods/burstable/pod{UID}/{CID}");
        // A hostNetwork pod's HOSTNAME is the node's name.
        let id = Identity::from_cgroup(&cgroup).with_env([("HOSTNAME", "gpu-node-7")]);
        let other = "0000000a-0000-4000-8000-00000000000b";
        let pod_dirs =
            [format!("kube-system_coredns-x_{other}"), format!("ml-team_train-7f9c_{UID}")];
        let links = [
            format!("coredns-x_kube-system_coredns-{}.log", "f".repeat(64)),
            format!("train-7f9c_ml-team_data-loader-{CID}.log"),
        ];
        let named = id.clone().with_kubelet_logs(
            pod_dirs.iter().map(|s| s.as_str()),
            links.iter().map(|s| s.as_str()),
        );
        assert_eq!(
            (named.namespace.as_deref(), named.pod.as_deref(), named.container.as_deref()),
            (Some("ml-team"), Some("train-7f9c"), Some("data-loader"))
        );
        assert_eq!(named.label().as_deref(), Some("pod ml-team/train-7f9c, container data-loader"));
        // The pod's directory alone names the pod, not the container.
        let dir_only = id.clone().with_kubelet_logs(pod_dirs.iter().map(|s| s.as_str()), []);
        assert_eq!((dir_only.pod.as_deref(), dir_only.container), (Some("train-7f9c"), None));
        // Nothing of this pod's under the kubelet's logs: HOSTNAME stays, nothing is invented.
        let none = id.clone().with_kubelet_logs([pod_dirs[0].as_str()], [links[0].as_str()]);
        assert_eq!(none, id);
        // Outside a pod the kubelet's logs are not looked at.
        let plain = Identity::default().with_kubelet_logs(pod_dirs.iter().map(|s| s.as_str()), []);
        assert!(plain.is_empty());
    }

    #[test]
    fn a_jobs_identity_keeps_a_rank_only_when_it_is_one_rank() {
        let rank = |r| Identity {
            rank: Some(r),
            world_size: Some(2),
            run_id: Some("x".into()),
            ..Default::default()
        };
        let both = Identity::of_job([&rank(0), &rank(1)]);
        assert_eq!(
            (both.rank, both.world_size, both.run_id.as_deref()),
            (None, Some(2), Some("x"))
        );
        assert_eq!(both.label().as_deref(), Some("torchrun run x, 2 ranks"));
        assert_eq!(Identity::of_job([&rank(1)]).rank, Some(1));
        assert_eq!(Identity::of_job([]).label(), None);
        let pod = Identity { pod: Some("train/../x".into()), rank: Some(3), ..Default::default() };
        assert_eq!(pod.file_tag().as_deref(), Some("pod-train_.._x-rank3"));
    }
}
