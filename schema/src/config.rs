//! One run's configuration.
//!
//! [`RunConfig`] is the single description of a run: the worker builds it from its flags, the
//! launcher builds it from a spec and renders it back into worker flags with
//! [`RunConfig::to_worker_args`], and the worker's `start` record carries it so ingest can group runs.
//! [`RunConfig::validate`] holds every rule about impossible combinations, so the worker and the
//! launcher reject the same things with the same message, naming the flag.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::fields::field_names;
pub use crate::models::default_target_len;
use crate::models::ModelPreset;

/// A configuration that cannot run, with the flag (or spec key) it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --{field}: {reason}")]
pub struct ConfigError {
    /// The worker flag without dashes, e.g. `offload`; the launcher maps it to its spec key.
    pub field: &'static str,
    pub reason: String,
}

impl ConfigError {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self { field, reason: reason.into() }
    }
}

use crate::text_enum::text_enum;

/// ZeRO stage. Serialized as the integer 0..=3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "u8", into = "u8")]
pub enum ZeroStage {
    /// Replicated data parallelism: gradients all-reduced.
    Z0,
    /// Optimizer states (fp32 master weights, Adam moments) partitioned.
    Z1,
    /// Also gradients partitioned as they are produced.
    Z2,
    /// Also parameters partitioned, gathered per block around its use.
    Z3,
}

impl ZeroStage {
    pub const ALL: [ZeroStage; 4] = [ZeroStage::Z0, ZeroStage::Z1, ZeroStage::Z2, ZeroStage::Z3];
    pub fn index(self) -> u8 {
        self as u8
    }
}

impl TryFrom<u8> for ZeroStage {
    type Error = String;
    fn try_from(v: u8) -> Result<Self, String> {
        match v {
            0 => Ok(Self::Z0),
            1 => Ok(Self::Z1),
            2 => Ok(Self::Z2),
            3 => Ok(Self::Z3),
            _ => Err(format!("ZeRO stage must be 0, 1, 2 or 3, not {v}")),
        }
    }
}

impl From<ZeroStage> for u8 {
    fn from(s: ZeroStage) -> u8 {
        s.index()
    }
}

impl fmt::Display for ZeroStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.index())
    }
}

impl FromStr for ZeroStage {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v: u8 = s.trim().parse().map_err(|_| format!("ZeRO stage must be 0, 1, 2 or 3, not '{s}'"))?;
        Self::try_from(v)
    }
}

/// What lives in host memory instead of on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Offload {
    #[default]
    #[serde(rename = "none")]
    None,
    /// fp32 master weights and Adam moments on the host (stages 1-3).
    #[serde(rename = "optimizer")]
    Optimizer,
    /// Also the parameters (stage 3 only).
    #[serde(rename = "optimizer+params")]
    OptimizerParams,
}
text_enum!(Offload, "offload", { None => "none", Optimizer => "optimizer", OptimizerParams => "optimizer+params" });

/// Numeric precision of parameters, gradients and compute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bf16 parameters, gradients and compute; fp32 master weights and Adam moments.
    #[default]
    Bf16,
    /// fp16 like bf16, plus dynamic loss scaling (overflowing steps are skipped and logged).
    Fp16,
    /// fp32 everywhere; the parameters are the master weights.
    Fp32,
}
text_enum!(Precision, "precision", { Bf16 => "bf16", Fp16 => "fp16", Fp32 => "fp32" });

impl Precision {
    /// Bytes of one parameter (and one gradient) element on the device.
    pub fn param_bytes(self) -> u64 {
        match self {
            Precision::Bf16 | Precision::Fp16 => 2,
            Precision::Fp32 => 4,
        }
    }
    /// Bytes of optimizer state per parameter: fp32 master copy (mixed precision only) + Adam m + v.
    pub fn optimizer_bytes(self) -> u64 {
        match self {
            Precision::Bf16 | Precision::Fp16 => 12,
            Precision::Fp32 => 8,
        }
    }
    /// Whether the fp32 master weights are a separate copy of the parameters.
    pub fn has_master_copy(self) -> bool {
        !matches!(self, Precision::Fp32)
    }
}

/// Where the worker computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeviceRequest {
    /// CUDA when a GPU is visible, otherwise CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}
text_enum!(DeviceRequest, "device", { Auto => "auto", Cpu => "cpu", Cuda => "cuda" });

/// Which collectives move their data with the copy engines (`--copy-engines`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CopyEngines {
    /// All-gathers only (stage 3's parameters, stages 1-2's updated parameters); gradients are
    /// still reduced by NCCL, whose reduction kernels are faster than the copy engines' add.
    AllGather,
    /// All-gathers, reduce-scatters and all-reduces.
    All,
}
text_enum!(CopyEngines, "copy-engines", { AllGather => "all-gather", All => "all" });

/// AdamW hyper-parameters. Under the `cli` feature they are also the worker's flags (`--lr`,
/// `--weight-decay`, ...), with [`OptimConfig::DEFAULT`] as their defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[cfg_attr(feature = "cli", command(next_help_heading = "Optimizer (AdamW)"))]
#[serde(deny_unknown_fields)]
pub struct OptimConfig {
    /// Learning rate.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = OptimConfig::DEFAULT.lr))]
    pub lr: f64,
    /// Decay of the first moment (the gradients' running mean), in [0, 1).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = OptimConfig::DEFAULT.beta1))]
    pub beta1: f64,
    /// Decay of the second moment (the squared gradients' running mean), in [0, 1).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = OptimConfig::DEFAULT.beta2))]
    pub beta2: f64,
    /// Added to the second moment's square root in the update's denominator.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = OptimConfig::DEFAULT.eps))]
    pub eps: f64,
    /// Decoupled weight decay (AdamW's), applied to every parameter.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = OptimConfig::DEFAULT.weight_decay))]
    pub weight_decay: f64,
}

impl OptimConfig {
    /// The defaults (nanoGPT's GPT-2 settings).
    pub const DEFAULT: OptimConfig = OptimConfig { lr: 3e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Knobs of the ZeRO engine that trade memory for overlap. Under the `cli` feature they are also
/// the worker's flags (`--bucket-mb`, `--hpz`, ...), with [`EngineConfig::DEFAULT`] as defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[cfg_attr(feature = "cli", command(next_help_heading = "ZeRO engine"))]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Gradient bucket size in MiB: consecutive blocks are reduced together until a bucket holds
    /// at least this much (a bucket never splits a block).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = EngineConfig::DEFAULT.bucket_mb))]
    pub bucket_mb: f64,
    /// Stage 3: how many blocks' parameters are gathered ahead of the one computing.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = EngineConfig::DEFAULT.prefetch))]
    pub prefetch: u32,
    /// fp16: the loss scale starts at 2^this (DeepSpeed's `initial_scale_power`).
    #[serde(default = "default_loss_scale_power")]
    #[cfg_attr(feature = "cli", arg(long, default_value_t = EngineConfig::DEFAULT.loss_scale_power))]
    pub loss_scale_power: u32,
    /// Stage 3, ZeRO++'s hierarchical partitioning (hpZ): a secondary copy of the parameters
    /// partitioned within groups of this many consecutive ranks (a node), filled from the forward
    /// all-gather, so the backward all-gathers stay inside the group. Must divide the world size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "cli", arg(long))]
    pub hpz: Option<u32>,
    /// GPUs: the most thread blocks (CTAs) one NCCL collective may occupy (NCCL's `maxCTAs`).
    /// Fewer leave more SMs to the computation collectives overlap with; absent is NCCL's choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "cli", arg(long))]
    pub comm_ctas: Option<u32>,
    /// GPUs of one host: these collectives move their data with the copy engines (peer copies
    /// through CUDA IPC) instead of NCCL's kernels, which share the SMs with the computation they
    /// overlap: `all-gather`, or `all` (with reduce-scatters and all-reduces). NCCL still carries
    /// everything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "cli", arg(long))]
    pub copy_engines: Option<CopyEngines>,
}

fn default_loss_scale_power() -> u32 {
    EngineConfig::DEFAULT.loss_scale_power
}

impl EngineConfig {
    /// The defaults.
    pub const DEFAULT: EngineConfig = EngineConfig {
        bucket_mb: 32.0,
        prefetch: 1,
        loss_scale_power: 16,
        hpz: None,
        comm_ctas: None,
        copy_engines: None,
    };
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Everything that defines one run of the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelPreset,
    pub stage: ZeroStage,
    #[serde(default)]
    pub offload: Offload,
    /// Offload's Twin-Flow split (DeepSpeed ZeRO-Offload++'s `offload_optimizer.ratio`): the share
    /// of each rank's optimizer partition kept and updated on the host, in (0, 1]; the rest stays
    /// on the device and is updated there, at the same time. Absent means 1, all on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_ratio: Option<f64>,
    /// Offload's delayed parameter update (DeepSpeed's DPU), on after this many exact steps: from
    /// then on the host's update of step t runs during step t + 1's forward and backward, which
    /// therefore uses the parameters after update t − 1 (one step stale). Absent: every step exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delayed_update_after: Option<u32>,
    #[serde(default)]
    pub precision: Precision,
    /// Sequences per rank per micro-step.
    pub micro_batch: u32,
    /// Tokens per sequence (decoder) or input tokens (encoder-decoder); vectors per sample (MLP).
    pub seq_len: u32,
    /// Encoder-decoder models: target (decoder) tokens per sequence; absent means
    /// [`default_target_len`] of `seq_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_len: Option<u32>,
    /// Micro-steps per optimizer step.
    #[serde(default = "one")]
    pub grad_accum: u32,
    /// Optimizer steps, warmup included.
    pub steps: u32,
    /// The first `warmup` steps are flagged as warmup in the log and left out of the summary.
    #[serde(default)]
    pub warmup: u32,
    #[serde(default)]
    pub seed: u64,
    /// Train on this text file (byte-level tokens) instead of seeded synthetic tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// Evaluate every this many steps and after the last: the mean loss, forward only, over one
    /// global batch of held-out samples (the end of `data`: its last tenth, or one sample if more;
    /// training then leaves it alone; otherwise seeded samples training never draws). Absent: no evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_every: Option<u32>,
    #[serde(default)]
    pub device: DeviceRequest,
    /// One GPU: from the last warmup step on, each micro-step's forward and backward are replayed
    /// from CUDA graphs captured once, so the host launches two graphs instead of every kernel
    /// (the optimizer step stays eager). The same computation, in the same order.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cuda_graph: bool,
    #[serde(default)]
    pub optim: OptimConfig,
    #[serde(default)]
    pub engine: EngineConfig,
}

/// [`RunConfig::knobs`] of these optimizer and engine settings.
fn knob_texts(optim: &OptimConfig, engine: &EngineConfig) -> Vec<(&'static str, Option<String>)> {
    fn texts<T: Serialize + for<'de> Deserialize<'de>>(value: &T) -> Vec<(&'static str, Option<String>)> {
        let json = serde_json::to_value(value).unwrap_or_default();
        field_names::<T>()
            .iter()
            .map(|&name| {
                let text = match json.get(name) {
                    None | Some(serde_json::Value::Null) => None,
                    Some(serde_json::Value::String(s)) => Some(s.clone()),
                    // Integers as integers; floats in Rust's shortest round-trip form
                    // (`0.0003`, not serde_json's `3e-4`), as the flags always had them.
                    Some(serde_json::Value::Number(n)) => {
                        Some(n.as_u64().map_or_else(|| n.as_f64().unwrap_or(f64::NAN).to_string(), |u| u.to_string()))
                    }
                    Some(other) => Some(other.to_string()),
                };
                (name, text)
            })
            .collect()
    }
    let mut all = texts(optim);
    all.extend(texts(engine));
    all
}

fn one() -> u32 {
    1
}

/// The fields of a [`RunConfig`] that the tables show as axes of their own (block, row or
/// column), so [`RunConfig::variant`] leaves them out.
pub const AXIS_FIELDS: &[&str] = &["model", "stage", "offload", "precision", "micro_batch", "seq_len", "grad_accum"];

/// The fields of a [`RunConfig`] that do not change what a step computes: runs differing only
/// there are repeats of one configuration, and tables combine them (saying how many). `device`
/// is shown through the device the run found (its GPU's name), not through the request.
pub const REPEAT_FIELDS: &[&str] = &["steps", "warmup", "seed", "device"];

impl RunConfig {
    /// A configuration with defaults for everything but the model and stage.
    pub fn new(model: ModelPreset, stage: ZeroStage) -> Self {
        Self {
            model,
            stage,
            offload: Offload::None,
            offload_ratio: None,
            delayed_update_after: None,
            precision: Precision::Bf16,
            micro_batch: 1,
            seq_len: model.spec().default_seq_len(),
            target_len: None,
            grad_accum: 1,
            steps: 10,
            warmup: 2,
            seed: 0,
            data: None,
            eval_every: None,
            device: DeviceRequest::Auto,
            cuda_graph: false,
            optim: OptimConfig::DEFAULT,
            engine: EngineConfig::DEFAULT,
        }
    }

    /// Checks every rule that does not depend on the machine. `world_size` is the number of ranks
    /// when known (the launcher knows it before the run, the worker after start-up).
    pub fn validate(&self, world_size: Option<u32>) -> Result<(), ConfigError> {
        if self.micro_batch == 0 {
            return Err(ConfigError::new("micro-batch", "must be at least 1"));
        }
        if self.seq_len == 0 {
            return Err(ConfigError::new("seq-len", "must be at least 1"));
        }
        let max_seq = self.model.spec().max_seq_len();
        if let Some(max) = max_seq {
            if self.seq_len > max {
                return Err(ConfigError::new(
                    "seq-len",
                    format!("{} exceeds the {} positions of model {}", self.seq_len, max, self.model),
                ));
            }
        }
        if let Some(t) = self.target_len {
            if !self.model.spec().is_encoder_decoder() {
                return Err(ConfigError::new(
                    "target-len",
                    format!("model {} is not an encoder-decoder; only T5 models have a target length", self.model),
                ));
            }
            if t == 0 {
                return Err(ConfigError::new("target-len", "must be at least 1"));
            }
        }
        // The logs record the path as text (`start.config.data`).
        if self.data.as_deref().is_some_and(|p| p.to_str().is_none()) {
            return Err(ConfigError::new("data", "the path is not valid UTF-8; the logs record it as text"));
        }
        if self.data.is_some() && self.model.spec().vocab() == 0 {
            return Err(ConfigError::new("data", format!("model {} takes vectors, not text", self.model)));
        }
        if self.grad_accum == 0 {
            return Err(ConfigError::new("grad-accum", "must be at least 1"));
        }
        if self.eval_every == Some(0) {
            return Err(ConfigError::new("eval-every", "must be at least 1"));
        }
        if self.steps == 0 {
            return Err(ConfigError::new("steps", "must be at least 1"));
        }
        if self.warmup >= self.steps {
            return Err(ConfigError::new(
                "warmup",
                format!("{} warmup steps leave none of the {} steps to measure", self.warmup, self.steps),
            ));
        }
        match (self.offload, self.stage) {
            (Offload::None, _) => {}
            (Offload::Optimizer, ZeroStage::Z0) => {
                return Err(ConfigError::new("offload", "optimizer offload needs ZeRO stage 1, 2 or 3"))
            }
            (Offload::OptimizerParams, s) if s != ZeroStage::Z3 => {
                return Err(ConfigError::new("offload", "optimizer+params offload needs ZeRO stage 3"))
            }
            _ => {}
        }
        if let Some(r) = self.offload_ratio {
            if self.offload == Offload::None {
                return Err(ConfigError::new("offload-ratio", "splits the offloaded optimizer; it needs --offload"));
            }
            // Written so that NaN fails too.
            if !(r > 0.0 && r <= 1.0) {
                return Err(ConfigError::new(
                    "offload-ratio",
                    format!("the host's share must be above 0 and at most 1, not {r}"),
                ));
            }
        }
        if self.delayed_update_after.is_some() {
            let refuse = |why: &str| Err(ConfigError::new("delayed-update", why.to_string()));
            match (self.offload, self.precision) {
                (Offload::None, _) => return refuse("delays the host's update; it needs --offload"),
                (Offload::OptimizerParams, _) => {
                    return refuse(
                        "not with optimizer+params: the forward would read the parameters the host is updating",
                    )
                }
                (_, Precision::Fp16) => {
                    return refuse("not with fp16: the overflow check needs every gradient before any update")
                }
                _ => {}
            }
            if self.grad_accum > 1 {
                return refuse(
                    "not with --grad-accum above 1: the micro-steps of a step would use different parameters",
                );
            }
            // A delay past the run's last step delays nothing, while the run is labelled delayed.
            if let Some(after) = self.delayed_update_after.filter(|&a| a >= self.steps) {
                return Err(ConfigError::new(
                    "delayed-update-after",
                    format!(
                        "step {after} is past the run's last step, {}: no step would be delayed (lower it or raise --steps)",
                        self.steps.saturating_sub(1)
                    ),
                ));
            }
        }
        if !(self.optim.lr.is_finite() && self.optim.lr > 0.0) {
            return Err(ConfigError::new("lr", "must be a positive number"));
        }
        // Adam's moment decays must lie in [0, 1) (at 1 the bias correction divides by zero) and
        // its epsilon must be positive (at 0 a parameter whose gradient is 0 divides 0 by 0).
        for (flag, beta) in [("beta1", self.optim.beta1), ("beta2", self.optim.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(ConfigError::new(flag, format!("must be at least 0 and below 1, not {beta}")));
            }
        }
        if !(self.optim.eps.is_finite() && self.optim.eps > 0.0) {
            return Err(ConfigError::new("eps", "must be a positive number"));
        }
        if !(self.optim.weight_decay.is_finite() && self.optim.weight_decay >= 0.0) {
            return Err(ConfigError::new("weight-decay", "must be a number of at least 0"));
        }
        if !(self.engine.bucket_mb.is_finite() && self.engine.bucket_mb > 0.0) {
            return Err(ConfigError::new("bucket-mb", "must be a positive number"));
        }
        if let Some(g) = self.engine.hpz {
            if self.stage != ZeroStage::Z3 {
                return Err(ConfigError::new("hpz", "hierarchical partitioning is a stage 3 option"));
            }
            if g == 0 {
                return Err(ConfigError::new("hpz", "the group size must be at least 1"));
            }
            if let Some(n) = world_size {
                if n % g != 0 {
                    return Err(ConfigError::new("hpz", format!("a group of {g} ranks does not divide the {n} ranks")));
                }
            }
        }
        if self.engine.comm_ctas == Some(0) {
            return Err(ConfigError::new("comm-ctas", "must be at least 1"));
        }
        if self.engine.copy_engines.is_some() && self.device == DeviceRequest::Cpu {
            return Err(ConfigError::new("copy-engines", "moves data between GPUs; not with --device cpu"));
        }
        if self.cuda_graph {
            self.validate_cuda_graph(world_size)?;
        }
        if self.engine.loss_scale_power > 60 {
            return Err(ConfigError::new("loss-scale-power", "must be at most 60"));
        }
        if let Some(n) = world_size {
            if n == 0 {
                return Err(ConfigError::new("world-size", "must be at least 1"));
            }
        }
        Ok(())
    }

    /// What `--cuda-graph` needs: every step the same work on one GPU, decided before it runs.
    fn validate_cuda_graph(&self, world_size: Option<u32>) -> Result<(), ConfigError> {
        let refuse = |why: &str| Err(ConfigError::new("cuda-graph", why.to_string()));
        if self.device == DeviceRequest::Cpu {
            return refuse("replays GPU work; not with --device cpu");
        }
        if world_size.is_some_and(|n| n > 1) {
            return refuse("captures one GPU's step; not with more than one rank");
        }
        // Stage 3 passes: on one rank without offload it keeps its parameters whole and gathers
        // nothing (`memory::ParamPath`), so its step is stage 1's.
        if self.offload != Offload::None {
            return refuse("not with --offload: the host's updates and copies are not part of the device's work");
        }
        if self.precision == Precision::Fp16 {
            return refuse("not with fp16: the loss scale changes between steps, and a graph fixes it");
        }
        if self.warmup < 2 {
            return refuse("needs --warmup 2 or more: an eager step first, then the step that captures");
        }
        Ok(())
    }

    /// The settings that differ from their defaults outside the grid dimensions (model, stage,
    /// offload, precision, batch, sequence, accumulation, device): the target length, the
    /// training text, optimizer and engine knobs, as `name=value` joined by `,`; empty for a
    /// default run. Tables keep runs of different variants apart. What a run is *not* told apart
    /// by is [`REPEAT_FIELDS`]: runs that differ only there are repeats of one configuration.
    pub fn variant(&self) -> String {
        let mut parts = Vec::new();
        let mut diff = |name: &str, value: String, default: String| {
            if value != default {
                parts.push(format!("{name}={value}"));
            }
        };
        // The target length changes what a step computes as much as the sequence length does.
        diff("target_len", self.target_len_or_default().to_string(), self.unset_target_len().to_string());
        let path = |p: &Option<PathBuf>| p.as_ref().map_or_else(|| "None".to_string(), |p| p.display().to_string());
        diff("data", path(&self.data), "None".to_string());
        // An explicit ratio of 1 computes what no ratio does: the same variant.
        diff("offload_ratio", self.host_share().to_string(), 1.0f64.to_string());
        let after = |v: Option<u32>| v.map_or_else(|| "None".to_string(), |v| v.to_string());
        diff("delayed_update_after", after(self.delayed_update_after), after(None));
        // With a text, evaluation holds its end out of training: a different run.
        diff("eval_every", after(self.eval_every), after(None));
        // The same computation, launched another way: a different speed.
        diff("cuda_graph", self.cuda_graph.to_string(), false.to_string());
        let unset = || "None".to_string();
        let defaults = knob_texts(&OptimConfig::DEFAULT, &EngineConfig::DEFAULT);
        for ((name, value), (_, default)) in self.knobs().into_iter().zip(defaults) {
            diff(name, value.unwrap_or_else(unset), default.unwrap_or_else(unset));
        }
        parts.join(",")
    }

    /// The optimizer's and the engine's settings by field name, in declaration order (optimizer
    /// first), in their flag text; `None` for an option left unset (and for a non-finite float,
    /// which [`Self::validate`] refuses). The names come from the structs
    /// themselves ([`field_names`]), so a new knob reaches the variant and the worker's flags
    /// without a list to extend.
    pub fn knobs(&self) -> Vec<(&'static str, Option<String>)> {
        knob_texts(&self.optim, &self.engine)
    }

    /// The share of an offloaded optimizer partition the host keeps: `offload_ratio`, or 1 (all)
    /// when it is not given.
    pub fn host_share(&self) -> f64 {
        self.offload_ratio.unwrap_or(1.0)
    }

    /// The decoder's tokens per sequence of an encoder-decoder model ([`default_target_len`] unless
    /// given); the other families have none and get `seq_len`, which their FLOP counts ignore.
    pub fn target_len_or_default(&self) -> u32 {
        self.target_len.unwrap_or_else(|| self.unset_target_len())
    }

    /// What [`Self::target_len_or_default`] gives when no target length is set.
    fn unset_target_len(&self) -> u32 {
        if self.model.spec().is_encoder_decoder() {
            default_target_len(self.seq_len)
        } else {
            self.seq_len
        }
    }

    /// Training FLOPs per token of this run's model at its sequence (and target) length.
    pub fn train_flops_per_token(&self) -> f64 {
        self.model.spec().train_flops_per_token(self.seq_len, self.target_len)
    }

    /// Sequences per optimizer step over all ranks.
    pub fn global_batch(&self, world_size: u32) -> u64 {
        u64::from(self.micro_batch) * u64::from(self.grad_accum) * u64::from(world_size)
    }

    /// Tokens per optimizer step over all ranks.
    pub fn tokens_per_step(&self, world_size: u32) -> u64 {
        self.global_batch(world_size) * u64::from(self.seq_len)
    }

    /// The worker flags that reproduce this configuration (without `--log-dir` and `--run-id`,
    /// which belong to where a run is put, not to what it is).
    pub fn to_worker_args(&self) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut push = |k: &str, v: String| {
            a.push(format!("--{k}"));
            a.push(v);
        };
        push("model", self.model.to_string());
        push("stage", self.stage.to_string());
        push("offload", self.offload.to_string());
        if let Some(r) = self.offload_ratio {
            push("offload-ratio", r.to_string());
        }
        push("precision", self.precision.to_string());
        push("micro-batch", self.micro_batch.to_string());
        push("seq-len", self.seq_len.to_string());
        if let Some(t) = self.target_len {
            push("target-len", t.to_string());
        }
        push("grad-accum", self.grad_accum.to_string());
        push("steps", self.steps.to_string());
        push("warmup", self.warmup.to_string());
        push("seed", self.seed.to_string());
        if let Some(d) = &self.data {
            push("data", d.display().to_string());
        }
        if let Some(n) = self.eval_every {
            push("eval-every", n.to_string());
        }
        push("device", self.device.to_string());
        for (name, value) in self.knobs() {
            if let Some(v) = value {
                push(&name.replace('_', "-"), v);
            }
        }
        // A switch and its setting (after `push`, which takes values only).
        if let Some(n) = self.delayed_update_after {
            a.extend(["--delayed-update".into(), "--delayed-update-after".into(), n.to_string()]);
        }
        if self.cuda_graph {
            a.push("--cuda-graph".into());
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_round_trip() {
        for o in Offload::ALL {
            assert_eq!(o.as_str().parse::<Offload>().unwrap(), *o);
            assert_eq!(serde_json::to_string(o).unwrap(), format!("\"{}\"", o.as_str()));
        }
        for p in Precision::ALL {
            assert_eq!(p.as_str().parse::<Precision>().unwrap(), *p);
            assert_eq!(serde_json::to_string(p).unwrap(), format!("\"{}\"", p.as_str()));
        }
        for s in ZeroStage::ALL {
            assert_eq!(s.to_string().parse::<ZeroStage>().unwrap(), s);
            assert_eq!(serde_json::to_string(&s).unwrap(), s.to_string());
        }
        assert!("4".parse::<ZeroStage>().is_err());
        assert!(serde_json::from_str::<ZeroStage>("7").is_err());
        assert!("fp8".parse::<Precision>().unwrap_err().contains("bf16, fp16, fp32"));
    }

    #[test]
    fn offload_rules_name_the_flag() {
        let mut c = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z0);
        c.offload = Offload::Optimizer;
        assert_eq!(c.validate(None).unwrap_err().field, "offload");
        c.stage = ZeroStage::Z2;
        c.offload = Offload::OptimizerParams;
        assert!(c.validate(None).unwrap_err().reason.contains("stage 3"));
    }

    /// A data path that is not UTF-8 is refused by name: the `start` record holds it as text,
    /// and its serialisation would fail mid-run.
    #[test]
    fn a_data_path_must_be_text() {
        use std::os::unix::ffi::OsStrExt;
        let mut c = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z0);
        c.data = Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/bad\xff.txt")));
        assert_eq!(c.validate(None).unwrap_err().field, "data");
        c.data = Some("/tmp/good.txt".into());
        assert!(c.validate(None).is_ok());
    }

    /// The delayed update needs optimizer offload without fp16 or accumulation; refusals name it.
    #[test]
    fn delayed_update_rules_name_the_flag() {
        let mut c = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z2);
        c.delayed_update_after = Some(10);
        assert_eq!(c.validate(None).unwrap_err().field, "delayed-update");
        c.offload = Offload::Optimizer;
        // After the run's last step (10 steps: 0-9), the delay would delay nothing.
        assert_eq!(c.validate(None).unwrap_err().field, "delayed-update-after");
        c.steps = 20;
        c.validate(None).unwrap();
        assert!(c.to_worker_args().windows(3).any(|w| w == ["--delayed-update", "--delayed-update-after", "10"]));
        assert_eq!(c.variant(), "delayed_update_after=10");
        for bad in [
            RunConfig { precision: Precision::Fp16, ..c.clone() },
            RunConfig { grad_accum: 2, ..c.clone() },
            RunConfig { stage: ZeroStage::Z3, offload: Offload::OptimizerParams, ..c.clone() },
        ] {
            assert_eq!(bad.validate(None).unwrap_err().field, "delayed-update", "{bad:?}");
        }
    }

    /// CUDA graphs need one GPU without offload, in bf16 or fp32, and two warmup steps (any
    /// stage: on one rank stage 3 gathers nothing); every refusal names the flag, and the flag
    /// reaches the variant and the worker's arguments.
    #[test]
    fn cuda_graph_rules_name_the_flag() {
        let mut c = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z2);
        c.cuda_graph = true;
        c.validate(Some(1)).unwrap();
        RunConfig { stage: ZeroStage::Z3, ..c.clone() }.validate(Some(1)).unwrap();
        assert!(c.to_worker_args().contains(&"--cuda-graph".to_string()));
        assert_eq!(c.variant(), "cuda_graph=true");
        for bad in [
            RunConfig { device: DeviceRequest::Cpu, ..c.clone() },
            RunConfig { stage: ZeroStage::Z3, offload: Offload::OptimizerParams, ..c.clone() },
            RunConfig { offload: Offload::Optimizer, ..c.clone() },
            RunConfig { precision: Precision::Fp16, ..c.clone() },
            RunConfig { warmup: 1, ..c.clone() },
        ] {
            assert_eq!(bad.validate(Some(1)).unwrap_err().field, "cuda-graph", "{bad:?}");
        }
        assert_eq!(c.validate(Some(2)).unwrap_err().field, "cuda-graph");
        c.cuda_graph = false;
        assert!(!c.to_worker_args().contains(&"--cuda-graph".to_string()));
        assert_eq!(c.variant(), "");
    }

    /// The host's share lies in (0, 1] and needs offload; every refusal names the flag.
    #[test]
    fn offload_ratio_rules_name_the_flag() {
        let mut c = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z2);
        c.offload_ratio = Some(0.5);
        let e = c.validate(None).unwrap_err();
        assert_eq!((e.field, e.to_string().contains("needs --offload")), ("offload-ratio", true), "{e}");
        c.offload = Offload::Optimizer;
        c.validate(None).unwrap();
        for bad in [0.0, -0.5, 1.0 + 1e-9, f64::NAN, f64::INFINITY] {
            c.offload_ratio = Some(bad);
            assert_eq!(c.validate(None).unwrap_err().field, "offload-ratio", "{bad}");
        }
        for good in [1e-6, 0.25, 1.0] {
            c.offload_ratio = Some(good);
            c.validate(None).unwrap();
        }
        // Rendered as a flag only when set; named in the variant unless it is 1, all on the host.
        assert!(c.to_worker_args().windows(2).any(|w| w == ["--offload-ratio", "1"]));
        assert_eq!(c.variant(), "");
        c.offload_ratio = Some(0.25);
        assert_eq!(c.variant(), "offload_ratio=0.25");
        c.offload_ratio = None;
        assert!(!c.to_worker_args().iter().any(|a| a == "--offload-ratio"));
        assert_eq!(c.variant(), "");
    }

    #[test]
    fn variant_names_only_what_differs() {
        let mut c = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z2);
        c.micro_batch = 8;
        assert_eq!(c.variant(), "");
        c.engine.comm_ctas = Some(8);
        c.optim.lr = 1e-3;
        assert_eq!(c.variant(), "lr=0.001,comm_ctas=8");
        c.engine.copy_engines = Some(CopyEngines::AllGather);
        assert_eq!(c.variant(), "lr=0.001,comm_ctas=8,copy_engines=all-gather");
    }

    #[test]
    fn copy_engines_need_gpus() {
        let mut c = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z2);
        c.engine.copy_engines = Some(CopyEngines::All);
        c.device = DeviceRequest::Cpu;
        assert_eq!(c.validate(None).unwrap_err().field, "copy-engines");
        c.device = DeviceRequest::Auto;
        c.validate(None).unwrap();
    }

    #[test]
    fn warmup_must_leave_measured_steps() {
        let mut c = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z1);
        c.steps = 2;
        c.warmup = 2;
        assert_eq!(c.validate(None).unwrap_err().field, "warmup");
        c.warmup = 1;
        c.validate(Some(2)).unwrap();
    }

    #[test]
    fn seq_len_is_bounded_by_positions() {
        let mut c = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z0);
        c.seq_len = 2048;
        assert_eq!(c.validate(None).unwrap_err().field, "seq-len");
    }

    #[test]
    fn target_len_belongs_to_encoder_decoders() {
        let mut c = RunConfig::new(ModelPreset::T5Small, ZeroStage::Z2);
        assert_eq!(c.target_len_or_default(), 128);
        c.seq_len = 3;
        assert_eq!(c.target_len_or_default(), 1);
        c.target_len = Some(0);
        assert_eq!(c.validate(None).unwrap_err().field, "target-len");
        c.target_len = Some(700);
        c.validate(None).unwrap();
        assert_eq!(c.target_len_or_default(), 700);
        assert_eq!(c.variant(), "target_len=700");
        let mut g = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z0);
        g.target_len = Some(8);
        assert!(g.validate(None).unwrap_err().reason.contains("encoder-decoder"));
    }

    /// Every field of a configuration is an axis of the tables, part of the variant, or a field
    /// that repeats ignore: a new knob that is none of these would let tables pool runs that
    /// differ in it.
    #[test]
    fn every_field_is_an_axis_a_variant_or_a_repeat() {
        let mut base = RunConfig::new(ModelPreset::T5Small, ZeroStage::Z2);
        // Every optional field present, so that every key is in the JSON.
        base.target_len = Some(32);
        base.data = Some("a.txt".into());
        base.eval_every = Some(5);
        base.offload = Offload::Optimizer;
        base.offload_ratio = Some(0.5);
        base.delayed_update_after = Some(3);
        base.engine.hpz = Some(2);
        base.engine.comm_ctas = Some(4);
        base.engine.copy_engines = Some(CopyEngines::AllGather);
        let json = serde_json::to_value(&base).unwrap();
        let mut seen = 0;
        for (key, value) in json.as_object().unwrap() {
            let paths: Vec<(String, Option<String>)> = match value.as_object() {
                Some(inner) => inner.keys().map(|k| (key.clone(), Some(k.clone()))).collect(),
                None => vec![(key.clone(), None)],
            };
            for (outer, inner) in paths {
                seen += 1;
                let name = inner.clone().unwrap_or_else(|| outer.clone());
                if AXIS_FIELDS.contains(&name.as_str()) || REPEAT_FIELDS.contains(&name.as_str()) {
                    continue;
                }
                let mut changed = json.clone();
                let slot = match &inner {
                    Some(i) => &mut changed[&outer][i],
                    None => &mut changed[&outer],
                };
                *slot = match slot.clone() {
                    serde_json::Value::Number(n) if n.is_u64() => serde_json::json!(n.as_u64().unwrap() + 1),
                    serde_json::Value::Number(n) => serde_json::json!(n.as_f64().unwrap() * 1.5 + 0.01),
                    serde_json::Value::String(_) if name == "copy_engines" => serde_json::json!("all"),
                    serde_json::Value::String(s) => serde_json::json!(format!("{s}.other")),
                    other => panic!("{name}: a field of kind {other} the test does not know how to change"),
                };
                let other: RunConfig = serde_json::from_value(changed).unwrap();
                assert_ne!(other.variant(), base.variant(), "a run differing in `{name}` has the same variant");
            }
        }
        assert!(seen >= 20, "only {seen} fields seen");
    }

    #[test]
    fn the_mlp_reads_no_text() {
        let mut c = RunConfig::new(ModelPreset::Mlp, ZeroStage::Z1);
        c.validate(None).unwrap();
        c.data = Some("text.txt".into());
        assert_eq!(c.validate(None).unwrap_err().field, "data");
    }

    #[test]
    fn json_round_trip_and_unknown_keys_rejected() {
        let c = RunConfig::new(ModelPreset::Gpt2Xl, ZeroStage::Z3);
        let s = serde_json::to_string(&c).unwrap();
        assert!(!s.contains("target_len"), "an absent target length is left out: {s}");
        let back: RunConfig = serde_json::from_str(&s).unwrap();
        assert_eq!(back, c);
        let mut t5 = RunConfig::new(ModelPreset::T5Base, ZeroStage::Z3);
        t5.target_len = Some(64);
        assert_eq!(serde_json::from_str::<RunConfig>(&serde_json::to_string(&t5).unwrap()).unwrap(), t5);
        let bad = s.replacen("\"steps\"", "\"stepz\"", 1);
        assert!(serde_json::from_str::<RunConfig>(&bad).is_err());
    }

    /// Mixed precision keeps an fp32 master copy (4 of its 12 optimizer bytes); fp32 updates the
    /// parameters themselves and keeps only Adam's two moments.
    #[test]
    fn only_mixed_precision_keeps_a_master_copy() {
        assert!(Precision::Bf16.has_master_copy());
        assert!(Precision::Fp16.has_master_copy());
        assert!(!Precision::Fp32.has_master_copy());
        for p in Precision::ALL {
            let master = if p.has_master_copy() { 4 } else { 0 };
            assert_eq!(p.optimizer_bytes(), master + 8, "{p}");
        }
    }

    /// Parameter offload is what stage 3 is for: accepted there, refused on every other stage.
    #[test]
    fn optimizer_and_params_offload_is_accepted_on_stage_3_only() {
        for stage in ZeroStage::ALL {
            let mut c = RunConfig::new(ModelPreset::Tiny, stage);
            c.offload = Offload::OptimizerParams;
            match stage {
                ZeroStage::Z3 => c.validate(Some(4)).unwrap(),
                _ => assert_eq!(c.validate(Some(4)).unwrap_err().field, "offload", "stage {stage}"),
            }
        }
    }

    /// The learning rate, Adam's epsilon and the bucket size must be finite and above 0; the weight
    /// decay finite and at least 0. Each refusal names its flag.
    #[test]
    fn optimizer_and_bucket_settings_refuse_zero_negative_and_non_finite() {
        let base = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z1);
        type Set = fn(&mut RunConfig, f64);
        let knobs: [(&str, Set, &[f64], &[f64]); 4] = [
            ("lr", |c, v| c.optim.lr = v, &[0.0, -1e-3, f64::NAN, f64::INFINITY], &[1e-9, 3e-4, 10.0]),
            ("eps", |c, v| c.optim.eps = v, &[0.0, -1e-8, f64::NAN, f64::INFINITY], &[1e-30, 1e-8]),
            ("weight-decay", |c, v| c.optim.weight_decay = v, &[-0.1, -1e-12, f64::NAN, f64::INFINITY], &[0.0, 0.1]),
            ("bucket-mb", |c, v| c.engine.bucket_mb = v, &[0.0, -32.0, f64::NAN, f64::INFINITY], &[0.5, 32.0]),
        ];
        for (flag, set, bad, good) in knobs {
            for &v in bad {
                let mut c = base.clone();
                set(&mut c, v);
                assert_eq!(c.validate(None).unwrap_err().field, flag, "{flag} = {v}");
            }
            for &v in good {
                let mut c = base.clone();
                set(&mut c, v);
                assert_eq!(c.validate(None), Ok(()), "{flag} = {v}");
            }
        }
    }

    /// hpZ groups belong to stage 3, hold at least one rank and must tile the world exactly.
    #[test]
    fn hpz_needs_stage_3_and_a_group_size_dividing_the_world() {
        let mut c = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z3);
        for (g, world) in [(1, 8), (2, 8), (4, 8), (8, 8), (8, 16)] {
            c.engine.hpz = Some(g);
            assert_eq!(c.validate(Some(world)), Ok(()), "groups of {g} on {world} ranks");
        }
        for (g, world) in [(3, 8), (16, 8), (5, 16)] {
            c.engine.hpz = Some(g);
            assert_eq!(c.validate(Some(world)).unwrap_err().field, "hpz", "groups of {g} on {world} ranks");
            // Before the world size is known only the group itself is checked.
            assert_eq!(c.validate(None), Ok(()), "groups of {g}");
        }
        c.engine.hpz = Some(0);
        assert_eq!(c.validate(None).unwrap_err().field, "hpz");
        assert_eq!(c.validate(Some(8)).unwrap_err().field, "hpz");
        for stage in [ZeroStage::Z0, ZeroStage::Z1, ZeroStage::Z2] {
            let mut c = RunConfig::new(ModelPreset::Tiny, stage);
            c.engine.hpz = Some(2);
            assert_eq!(c.validate(Some(8)).unwrap_err().field, "hpz", "stage {stage}");
        }
    }

    /// The fp16 loss scale starts at 2^power: 2^60 is the largest start allowed.
    #[test]
    fn loss_scale_power_is_at_most_60() {
        let mut c = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z2);
        c.precision = Precision::Fp16;
        for p in [0, 16, 60] {
            c.engine.loss_scale_power = p;
            assert_eq!(c.validate(None), Ok(()), "2^{p}");
        }
        for p in [61, 64, u32::MAX] {
            c.engine.loss_scale_power = p;
            assert_eq!(c.validate(None).unwrap_err().field, "loss-scale-power", "2^{p}");
        }
    }

    /// 3 sequences × 5 micro-steps × 4 ranks = 60 sequences a step; at GPT-2's 1024 tokens,
    /// 61,440 tokens.
    #[test]
    fn global_batch_multiplies_micro_batch_accumulation_and_ranks() {
        let mut c = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z1);
        c.micro_batch = 3;
        c.grad_accum = 5;
        assert_eq!(c.seq_len, 1024);
        assert_eq!(c.global_batch(4), 60);
        assert_eq!(c.tokens_per_step(4), 61_440);
        assert_eq!(c.global_batch(1), 15);
        assert_eq!(c.tokens_per_step(1), 15_360);
        c.seq_len = 7;
        assert_eq!(c.tokens_per_step(4), 420);
    }

    /// A run's FLOPs per token are its model's at the run's lengths: GPT-2 124M at 1024 tokens is
    /// nanoGPT's `6·N + 12·L·d·T` (N without the 1024 × 768 learned positions); T5-small at 512
    /// input tokens trains with its default target of 128 unless the run names another.
    #[test]
    fn run_flops_per_token_are_its_models_at_its_lengths() {
        let gpt2 = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z0);
        let n = 124_439_808.0 - 1024.0 * 768.0;
        assert_eq!(gpt2.train_flops_per_token(), 6.0 * n + 12.0 * 12.0 * 768.0 * 1024.0);
        let mut t5 = RunConfig::new(ModelPreset::T5Small, ZeroStage::Z0);
        let close = |got: f64, want: f64| assert!((got - want).abs() <= 1e-12 * want, "{got} vs {want}");
        // See models.rs's `t5_flops_with_a_shorter_target_count_the_decoder_per_target_token`.
        close(t5.train_flops_per_token(), 214_654_080.0);
        t5.target_len = Some(512);
        close(t5.train_flops_per_token(), 6.0 * 60_506_624.0 + 12.0 * 6.0 * 512.0 * 512.0 * 3.0);
    }

    /// The flags the launcher renders for a run: every setting, in the worker's spelling, with the
    /// optimizer and engine defaults written out (floats in their shortest decimal form).
    #[test]
    fn worker_args_spell_out_every_setting() {
        let mut c = RunConfig::new(ModelPreset::Gpt2, ZeroStage::Z2);
        c.micro_batch = 8;
        c.grad_accum = 4;
        c.seed = 7;
        c.eval_every = Some(50);
        let want = [
            "--model",
            "gpt2",
            "--stage",
            "2",
            "--offload",
            "none",
            "--precision",
            "bf16",
            "--micro-batch",
            "8",
            "--seq-len",
            "1024",
            "--grad-accum",
            "4",
            "--steps",
            "10",
            "--warmup",
            "2",
            "--seed",
            "7",
            "--eval-every",
            "50",
            "--device",
            "auto",
            "--lr",
            "0.0003",
            "--beta1",
            "0.9",
            "--beta2",
            "0.95",
            "--eps",
            "0.00000001",
            "--weight-decay",
            "0.1",
            "--bucket-mb",
            "32",
            "--prefetch",
            "1",
            "--loss-scale-power",
            "16",
        ];
        assert_eq!(c.to_worker_args(), want);
    }
}
