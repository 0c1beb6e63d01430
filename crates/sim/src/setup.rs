//! What a simulation is given: the setup every server shares and each server's own spec.

use crate::model::ServerModel;
use crate::trace::LoadTrace;

/// What is simulated for every server.
#[derive(Debug, Clone)]
pub struct SimSetup {
    pub model: ServerModel,
    pub trace: LoadTrace,
    /// BE kinds the job pool draws from (names in `model.be`).
    pub be_pool: Vec<String>,
    /// Mean length of a BE job, s (exponential).
    pub be_job_mean_s: f64,
    /// Per-server AR(1) load noise, fraction of peak.
    pub noise_sd: f64,
    pub tick_s: f64,
    /// Extra agent TOML for every policy.
    pub agent_extra: String,
    /// The SLO window (`lc.slo.window_s`), s: a multiple of `tick_s`.
    pub window_s: f64,
    /// Each server's trace shifted (±30 min) and scaled (±5 %) by its seed, as servers of a
    /// fleet differ; off for the replay of one measured run, whose trace is the run's own.
    pub vary_servers: bool,
}

impl SimSetup {
    pub fn new(model: ServerModel, trace: LoadTrace) -> SimSetup {
        let be_pool = model.be.keys().cloned().collect();
        SimSetup {
            model,
            trace,
            be_pool,
            be_job_mean_s: 2.0 * 3600.0,
            noise_sd: 0.03,
            tick_s: 5.0,
            agent_extra: String::new(),
            window_s: 15.0,
            vary_servers: true,
        }
    }
}

/// One server of the fleet.
#[derive(Debug, Clone, Copy)]
pub struct ServerSpec {
    pub cores: u32,
    pub seed: u64,
    /// Simulated seconds from `start_s` (seconds since midnight).
    pub start_s: f64,
    pub duration_s: f64,
}
