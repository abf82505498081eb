//! A measured run as the fit takes it: its configuration, GPU, and the figures the model is fitted
//! on; and the keys that say which runs are repeats of one configuration.

use serde::{Deserialize, Serialize};

use crate::work::Query;

/// One measured run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub run_id: String,
    pub gpu: String,
    pub query: Query,
    /// Median step time by the wall-time definition (log schema version 2).
    pub step_ms: f64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: Option<u64>,
    pub device_memory_bytes: Option<u64>,
    pub peak_tflops: Option<f64>,
    /// Median of the logged optimizer phase (the update on the GPU, or offload's on the host).
    pub optimizer_ms: Option<f64>,
    /// Mean GPU utilisation over the measured steps (NVML), when logged: at 90% or more the run
    /// was bound by the device, below it by the host issuing kernels, whose repeats vary far more.
    pub gpu_util_pct: Option<f64>,
    /// The git commit of the worker that ran it, where its log says (`zerobench-build-info`).
    pub build: Option<String>,
}

/// GPU utilisation from which a run counts as device-bound in the validation report.
pub const DEVICE_BOUND_UTIL_PCT: f64 = 90.0;

impl Observation {
    /// Whether the run kept the GPU busy ([`DEVICE_BOUND_UTIL_PCT`] or more): None where no
    /// utilisation was logged.
    pub fn kept_gpu_busy(&self) -> Option<bool> {
        self.gpu_util_pct.map(|u| u >= DEVICE_BOUND_UTIL_PCT)
    }

    /// The configuration this run is one repeat of.
    pub fn config_key(&self) -> String {
        format!("{} z{}", self.stage_group_key(), self.query.config.stage.index())
    }

    /// The runs whose stages the stage choice compares: this run's [`Self::stage_group_key`] and
    /// its build. Runs of two builds of the worker run different code, so a group pooling them
    /// would rank the builds along with the stages; runs whose build is unknown group together.
    pub fn stage_choice_key(&self) -> String {
        format!("{} build {}", self.stage_group_key(), self.build.as_deref().unwrap_or("?"))
    }

    /// The configurations a user chooses a stage among: this run's but for its stage.
    pub fn stage_group_key(&self) -> String {
        let c = &self.query.config;
        format!(
            "{} {} {} {} mb{} ga{} seq{} tgt{} {}gpu {}node {}",
            self.gpu,
            c.model,
            c.offload,
            c.precision,
            c.micro_batch,
            c.grad_accum,
            c.seq_len,
            c.target_len_or_default(),
            self.query.gpus,
            self.query.nodes,
            c.variant()
        )
    }
}

#[cfg(test)]
impl Observation {
    /// A run `run_id` of `query` on a GPU named "GPU", measured at `step_ms` with a 1 GiB peak
    /// and nothing else logged: the tests' run.
    pub(crate) fn measured(run_id: String, query: Query, step_ms: f64) -> Observation {
        Observation {
            run_id,
            gpu: "GPU".into(),
            query,
            step_ms,
            peak_allocated_bytes: 1 << 30,
            peak_reserved_bytes: None,
            device_memory_bytes: None,
            peak_tflops: None,
            optimizer_ms: None,
            gpu_util_pct: None,
            build: None,
        }
    }
}
