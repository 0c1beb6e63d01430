//! `headroom kube-discover`: the node's LC pods, discovered live, one JSON line per change of
//! the set (`headroom_types::discovery::LcSetEvent`) on stdout. What the agent's `[kubernetes]
//! discover = true` sees, without the agent. With `--socket`, each set is followed by the
//! agent's `[kubernetes] advertise` (`headroom_types::advertise::AdvertiseLine`: value, floor,
//! horizon, last change and reason), also said in words on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use headroom_control::config::{KubernetesConfig, NODE_NAME_ENV};
use headroom_kube::{Discovery, DiscoveryOptions};
use headroom_types::discovery::LayoutChoice;

/// Flags of `headroom kube-discover`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The node whose pods are watched (default: [kubernetes] node_name, then $NODE_NAME)
    #[arg(long)]
    pub node: Option<String>,
    /// A kubeconfig file (default: [kubernetes] kubeconfig, then in-cluster, then $KUBECONFIG)
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// An agent config whose [kubernetes] section gives the defaults of the other flags
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where the cgroup hierarchies are mounted
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// kubelet's cgroup layout: auto, cgroupfs or systemd (default: [kubernetes] cgroup_layout)
    #[arg(long)]
    pub layout: Option<LayoutChoice>,
    /// Print the first full set and exit
    #[arg(long)]
    pub once: bool,
    /// Stop after this many seconds (default: run until interrupted)
    #[arg(long)]
    pub for_s: Option<f64>,
    /// The agent's control socket: after each set, print what the node advertises as
    /// headroom.io/be-cpu and why (its [kubernetes] advertise)
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

/// The agent's advertisement, asked on its control socket: a JSON line on stdout, the same in
/// words on stderr. An agent that does not answer or does not advertise is said on stderr.
fn print_advertise(socket: &std::path::Path, out: &mut impl Write) -> anyhow::Result<()> {
    use headroom_agent::publish::control::{request, Request};
    let status = match request(socket, &Request::Status) {
        Ok(r) => r.status,
        Err(e) => {
            eprintln!("headroom kube-discover: advertise: {e}");
            return Ok(());
        }
    };
    match status.and_then(|s| s.advertise) {
        Some(a) => {
            for l in super::ctl::advertise_lines(&a) {
                eprintln!("{l}");
            }
            let line = headroom_types::advertise::AdvertiseLine { advertise: a };
            writeln!(out, "{}", serde_json::to_string(&line)?)?;
            out.flush()?;
        }
        None => eprintln!(
            "headroom kube-discover: the agent on {} does not advertise ([kubernetes] advertise = false)",
            socket.display()
        ),
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let k = match &args.config {
        Some(path) => headroom_agent::config_file::read_kubernetes_config(path)
            .map_err(|e| super::usage(e.to_string()))?,
        None => KubernetesConfig::default(),
    };
    let node = match &args.node {
        Some(n) => n.clone(),
        None => k
            .node(std::env::var(NODE_NAME_ENV).ok())
            .map_err(|e| super::usage(format!("headroom kube-discover: give --node: {e}")))?,
    };
    let run_for = args
        .for_s
        .map(|f| super::seconds_flag("headroom kube-discover: --for-s", f))
        .transpose()?;
    let mut opts = DiscoveryOptions::new(&node);
    opts.kubeconfig = args
        .kubeconfig
        .clone()
        .or_else(|| k.kubeconfig.as_ref().map(PathBuf::from));
    opts.cgroup_root = args.cgroup_root.clone();
    opts.layout = args.layout.unwrap_or(k.cgroup_layout);
    // The newest set only, with what changed since the last line: a stalled stdout holds one
    // set, not one per pod event.
    let (tx, rx) = headroom_agent::runtime::LcEvents::channel();
    let sink: headroom_kube::EventSink = Box::new(move |ev| {
        let _ = tx.send(ev);
    });
    let discovery = Discovery::start(opts, Some(sink))
        .map_err(|e| super::agent::kube_start_error("headroom kube-discover", e))?;
    let deadline = run_for.map(|d| Instant::now() + d);
    let mut out = std::io::stdout().lock();
    // Whether a whole pod list arrived: `--for-s` ending before one printed nothing and exited
    // 0, which a script took for "no LC pod" (an unreachable or hanging API server).
    let mut synced_once = false;
    loop {
        let wait = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => Duration::from_secs(3600),
        };
        match rx.recv_timeout(wait) {
            Ok(ev) => {
                let synced = ev.set.synced;
                synced_once |= synced;
                writeln!(out, "{}", serde_json::to_string(&ev)?)?;
                out.flush()?;
                if let Some(socket) = &args.socket {
                    print_advertise(socket, &mut out)?;
                }
                if args.once && synced {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("headroom kube-discover: the watch of node {node} ended")
            }
        }
    }
    discovery.stop();
    if !synced_once {
        let secs = run_for.map(|d| d.as_secs_f64()).unwrap_or_default();
        let msg = format!(
            "headroom kube-discover: no complete pod list of node {node} from the API server in {} s (unreachable, refusing, hanging or answering what is not a pod list; a warning above says which once it lasts 10 s or fails); no LC set was printed",
            super::number(secs)
        );
        if args.once {
            anyhow::bail!("{msg}");
        }
        eprintln!("{msg}");
    }
    Ok(())
}
