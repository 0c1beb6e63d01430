//! Both kubelet layouts as real cgroups of this kernel (root only), `sleep` processes standing
//! in for pods: the group discovery derives for each pod is the one its process runs in, the
//! layout is detected, a BestEffort pod is refused (its group lies under the BE parent), and an
//! LC leaves the set when its group goes. Everything is made under a test-owned directory and
//! removed at the end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use headroom_kube::{detect, group_exists, Discoverer, KubeletLayout, PodEvent, PodFacts};
use headroom_types::discovery::PodQos;

/// Where a test may make cgroups: the v2 root, or the v1 `cpu` hierarchy.
fn cgroup_mount() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
    if v2.exists() {
        return Ok(PathBuf::from("/sys/fs/cgroup"));
    }
    for m in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
        if Path::new(m).join("cgroup.procs").exists() {
            return Ok(PathBuf::from(m));
        }
    }
    Err("no writable cgroup hierarchy (v2 root or v1 cpu)".into())
}

/// A test-owned cgroup tree: the groups made (removed deepest first) and the processes in them.
struct Tree {
    dirs: Vec<PathBuf>,
    procs: Vec<Child>,
}

impl Tree {
    fn mkdir_all(&mut self, base: &Path, rel: &str) -> PathBuf {
        let mut dir = base.to_path_buf();
        for part in rel.split('/') {
            dir = dir.join(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {dir:?}: {e}"));
                self.dirs.push(dir.clone());
            }
        }
        dir
    }

    /// A process standing in for a pod, placed in `group`.
    fn pod(&mut self, group: &Path) -> u32 {
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id();
        std::fs::write(group.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {group:?}: {e}"));
        self.procs.push(child);
        pid
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in self.dirs.iter().rev() {
            // A cgroup is removable once its last process has been reaped.
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

fn facts(name: &str, uid: &str, qos: &str) -> PodFacts {
    PodFacts {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
        node: "n1".into(),
        phase: "Running".into(),
        qos_class: qos.into(),
        annotations: [("headroom.io/slo-p99-us".to_string(), "500".to_string())].into(),
        container_ports: Vec::new(),
    }
}

fn procs_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default()
}

fn check_layout(mount: &Path, layout: KubeletLayout) {
    let root = mount.join(format!(
        "headroom-kube-test-{}-{layout:?}",
        std::process::id()
    ));
    let mut tree = Tree {
        dirs: Vec::new(),
        procs: Vec::new(),
    };
    tree.mkdir_all(mount, root.file_name().unwrap().to_str().unwrap());
    assert_eq!(detect(&root), None, "no kubelet layout yet");

    let pods = [
        (
            "guaranteed",
            "0c0c0c0c-0000-4000-8000-000000000001",
            "Guaranteed",
            PodQos::Guaranteed,
        ),
        (
            "burstable",
            "0c0c0c0c-0000-4000-8000-000000000002",
            "Burstable",
            PodQos::Burstable,
        ),
        (
            "besteffort",
            "0c0c0c0c-0000-4000-8000-000000000003",
            "BestEffort",
            PodQos::BestEffort,
        ),
    ];
    let mut pids = Vec::new();
    for (_, uid, _, qos) in &pods {
        let rel = layout.pod_cgroup(*qos, uid).unwrap();
        let dir = tree.mkdir_all(&root, rel.as_str());
        pids.push(tree.pod(&dir));
    }
    assert_eq!(detect(&root), Some(layout));

    let mut d = Discoverer::new("n1");
    d.apply(PodEvent::Init);
    for (name, uid, qos, _) in &pods {
        d.apply(PodEvent::InitApply(facts(name, uid, qos)));
    }
    d.apply(PodEvent::InitDone);
    let set = d
        .evaluate(detect(&root), |g| group_exists(&root, g), 1)
        .unwrap()
        .set;
    let names: Vec<&str> = set.lcs.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["ns/burstable", "ns/guaranteed"], "{set:?}");
    for (i, (name, ..)) in pods[..2].iter().enumerate() {
        let lc = set.get(&format!("ns/{name}")).unwrap();
        let procs = procs_of(&lc.cgroup.dir_in(&root));
        assert!(
            procs.lines().any(|l| l == pids[i].to_string()),
            "{layout:?}: pod {name}'s process {} in {}: {procs:?}",
            pids[i],
            lc.cgroup
        );
    }
    assert_eq!(set.refused.len(), 1);
    assert_eq!(set.refused[0].pod, "ns/besteffort");
    // The BestEffort pod's process lies under the BE parent the agent restricts.
    let be_pod = layout.pod_cgroup(PodQos::BestEffort, pods[2].1).unwrap();
    assert!(be_pod.is_within(&layout.besteffort_parent()));
    assert!(procs_of(&be_pod.dir_in(&root)).contains(&pids[2].to_string()));

    // The burstable pod stops: its process goes and kubelet removes its group.
    let mut child = tree.procs.remove(1);
    child.kill().unwrap();
    child.wait().unwrap();
    let rel = layout.pod_cgroup(PodQos::Burstable, pods[1].1).unwrap();
    let dir = rel.dir_in(&root);
    std::fs::remove_dir(&dir).unwrap_or_else(|e| panic!("rmdir {dir:?}: {e}"));
    tree.dirs.retain(|d| d != &dir);
    let set = d
        .evaluate(detect(&root), |g| group_exists(&root, g), 2)
        .unwrap()
        .set;
    let names: Vec<&str> = set.lcs.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["ns/guaranteed"]);
}

#[test]
fn both_kubelet_layouts_on_real_cgroups() {
    let mount = match cgroup_mount() {
        Ok(m) => m,
        Err(why) => {
            eprintln!("SKIP both_kubelet_layouts_on_real_cgroups: {why}");
            return;
        }
    };
    check_layout(&mount, KubeletLayout::Cgroupfs);
    check_layout(&mount, KubeletLayout::Systemd);
}
