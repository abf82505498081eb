//! What a foreign run was: model, ZeRO stage, offload, precision, micro-batch, GPUs. Foreign logs
//! rarely say, so it comes from, in order of precedence:
//! 1. a `run.json` beside the logs (or in the parent of a `logs/` folder): the launcher's, whose
//!    `config` is a whole `RunConfig`, or a hand-written one with keys (top-level or in `config`)
//!    `model`, `stage` (or `zero_stage`), `offload`, `precision`, `micro_batch` (or
//!    `train_micro_batch_size_per_gpu`), `grad_accum` (or `gradient_accumulation_steps`),
//!    `seq_len`, `target_len`, `world_size` (or `gpus`), `nodes`, `run_id` (or `id`, `name`);
//! 2. the logs themselves (DeepSpeed's printed configuration: stage, offload, precision,
//!    micro-batch, accumulation, world size; the FLOPs profiler's world size and batch size per
//!    GPU);
//! 3. the names of the folders below the ingest root (the folder given to `zerobench ingest`),
//!    down to the run's: `z1`/`zero1`/`stage1`, `mbs8`/`bs8`/`tmbspg8` (DeepSpeed autotuner),
//!    `gas2`, `offload` (`no-offload`, `offload-none`: none), `bf16`/`fp16`/`fp32`,
//!    `8gpus`/`gpus8`, and a model preset name as a whole token (`t5-large`, `gpt2-xl`, also
//!    without the dash; `mlperf` is no `mlp`).
//!
//! Key by key: what a `run.json` lacks comes from the logs, then from the names.

use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;
use zerobench_schema::job::PlannedRun;
use zerobench_schema::{ModelPreset, Offload, Precision, RunConfig, ZeroStage};

/// What is known about a foreign run's configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hints {
    pub run_id: Option<String>,
    pub model: Option<String>,
    pub stage: Option<ZeroStage>,
    pub offload: Option<Offload>,
    pub precision: Option<Precision>,
    pub micro_batch: Option<u32>,
    pub grad_accum: Option<u32>,
    pub seq_len: Option<u32>,
    /// T5: target tokens per sequence.
    pub target_len: Option<u32>,
    pub world_size: Option<u32>,
    pub nodes: Option<u32>,
}

impl Hints {
    /// Fills what `self` lacks from `other`.
    pub fn or(self, other: Hints) -> Hints {
        Hints {
            run_id: self.run_id.or(other.run_id),
            model: self.model.or(other.model),
            stage: self.stage.or(other.stage),
            offload: self.offload.or(other.offload),
            precision: self.precision.or(other.precision),
            micro_batch: self.micro_batch.or(other.micro_batch),
            grad_accum: self.grad_accum.or(other.grad_accum),
            seq_len: self.seq_len.or(other.seq_len),
            target_len: self.target_len.or(other.target_len),
            world_size: self.world_size.or(other.world_size),
            nodes: self.nodes.or(other.nodes),
        }
    }
}

/// The keys of a `run.json` (top-level or in `config`) that count something: GPUs, nodes,
/// sequences, steps, tokens. A 0 there counts nothing (per-GPU figures would divide by it): it is
/// taken as unknown, and [`zero_counts`] names it for the problem list.
const COUNT_KEYS: [&[&str]; 6] = [WORLD_KEYS, NODE_KEYS, MICRO_BATCH_KEYS, GRAD_ACCUM_KEYS, SEQ_KEYS, TARGET_KEYS];
const WORLD_KEYS: &[&str] = &["world_size", "gpus"];
const NODE_KEYS: &[&str] = &["nodes"];
const MICRO_BATCH_KEYS: &[&str] = &["micro_batch", "train_micro_batch_size_per_gpu"];
const GRAD_ACCUM_KEYS: &[&str] = &["grad_accum", "gradient_accumulation_steps"];
const SEQ_KEYS: &[&str] = &["seq_len"];
const TARGET_KEYS: &[&str] = &["target_len"];

/// The counting keys of a `run.json` value that hold 0 (`config.micro_batch` for one in
/// `config`), which [`from_run_json`] leaves unknown.
pub fn zero_counts(v: &serde_json::Value) -> Vec<String> {
    let mut keys = Vec::new();
    for (prefix, obj) in [("", Some(v)), ("config.", v.get("config"))] {
        let Some(obj) = obj.and_then(serde_json::Value::as_object) else { continue };
        for key in COUNT_KEYS.iter().flat_map(|keys| keys.iter()) {
            if obj.get(*key).and_then(serde_json::Value::as_u64) == Some(0) {
                keys.push(format!("{prefix}{key}"));
            }
        }
    }
    keys
}

/// A count, or nothing where it is 0.
fn count(n: u32) -> Option<u32> {
    Some(n).filter(|n| *n > 0)
}

/// Hints from a `run.json` value: the launcher's own record whole, else whatever keys a hand-written
/// one has. A count of 0 ([`zero_counts`]) stays unknown.
pub fn from_run_json(v: &serde_json::Value) -> Hints {
    if let Some(r) = PlannedRun::from_json(v) {
        let placement =
            Hints { run_id: Some(r.id), world_size: count(r.world_size), nodes: count(r.nodes), ..Hints::default() };
        return of_config(&r.config, placement);
    }
    let cfg = v.get("config").filter(|c| c.is_object()).unwrap_or(v);
    let get = |keys: &[&str]| keys.iter().find_map(|k| cfg.get(*k).or_else(|| v.get(*k)));
    let num = |keys: &[&str]| get(keys).and_then(serde_json::Value::as_u64).and_then(|n| u32::try_from(n).ok());
    let counted = |keys: &[&str]| num(keys).and_then(count);
    let text = |keys: &[&str]| get(keys).and_then(serde_json::Value::as_str).map(str::to_string);
    // Where the run is and what it is called are not part of a RunConfig.
    let placement = Hints {
        run_id: text(&["run_id", "id", "name"]),
        world_size: counted(WORLD_KEYS),
        nodes: counted(NODE_KEYS),
        ..Hints::default()
    };
    // The launcher's `config` is read as the configuration the worker runs, with its defaults, so
    // that it means what it means to the worker (an absent T5 target length, for one); anything
    // else key by key.
    match RunConfig::deserialize(cfg) {
        Ok(c) => of_config(&c, placement),
        Err(_) => Hints {
            model: text(&["model"]),
            stage: num(&["stage", "zero_stage"])
                .and_then(|s| u8::try_from(s).ok())
                .and_then(|s| ZeroStage::try_from(s).ok()),
            offload: text(&["offload"]).and_then(|s| s.parse().ok()),
            precision: text(&["precision"]).and_then(|s| s.parse().ok()),
            micro_batch: counted(MICRO_BATCH_KEYS),
            grad_accum: counted(GRAD_ACCUM_KEYS),
            seq_len: counted(SEQ_KEYS),
            target_len: counted(TARGET_KEYS),
            ..placement
        },
    }
}

/// The hints a whole run configuration gives, beside where the run is (`placement`).
fn of_config(c: &RunConfig, placement: Hints) -> Hints {
    Hints {
        model: Some(c.model.as_str().to_string()),
        stage: Some(c.stage),
        offload: Some(c.offload),
        precision: Some(c.precision),
        micro_batch: count(c.micro_batch),
        grad_accum: count(c.grad_accum),
        seq_len: count(c.seq_len),
        target_len: c.target_len.and_then(count),
        ..placement
    }
}

static STAGE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:^|[^a-z])(?:z|zero|stage|zero_stage)[_-]?([0-3])(?:$|[^0-9])").expect("valid regex")
});
static MBS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:^|[^a-z])(?:tmbspg|mbs|bs|micro_batch|microbatch)[_-]?([0-9]+)").expect("valid regex")
});
static GAS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?:^|[^a-z])gas[_-]?([0-9]+)").expect("valid regex"));
// A count before the word may be singular (`1gpu`, `2node`); one after it must be plural
// (`gpus4`, `nodes2`): `gpu3` and `node1` name a GPU or a node (`ds_gpu3.log`, a rank's log), not
// how many there are.
static NODES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:^|[^a-z0-9])(?:([0-9]+)[_-]?nodes?|nodes[_-]?([0-9]+))(?:$|[^0-9])").expect("valid regex")
});
static GPUS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:^|[^a-z0-9])(?:([0-9]+)[_-]?gpus?|gpus[_-]?([0-9]+))(?:$|[^0-9])").expect("valid regex")
});

/// Hints from the names of the folders from `root` (exclusive) down to `dir` (inclusive).
/// The grammar (case-insensitive, tokens anywhere in a name): `z2`/`zero2`/`stage2`/`zero_stage2`
/// (ZeRO stage), `mbs8`/`bs8`/`micro_batch8`/`tmbspg8` (micro-batch), `gas2` (accumulation),
/// `offload` (optimizer offload; `no-offload`, `offload-none` and the like: none), `bf16`/`fp16`/`fp32`, `4gpus`/`gpus4`, `2nodes`/`nodes2` (not
/// `gpu3` or `node1`: a GPU's or a node's index), and a model preset name (`t5-large`, `gpt2-xl`, also without the dash).
///
/// Only the path below the root counts: the folders above it (and the root's own name) are where
/// the user keeps the logs, not what the run was, and any name can be there: a temporary folder
/// `.tmp3z2k` reads as stage 2, a home `/home/bs4` as micro-batch 4. A `dir` not under `root`
/// gives nothing.
pub fn from_path(root: &Path, dir: &Path) -> Hints {
    let mut h = Hints::default();
    let Ok(below) = dir.strip_prefix(root) else { return h };
    // The nearest folder speaks first.
    for c in below.components().rev() {
        fill_from_name(&mut h, &c.as_os_str().to_string_lossy());
    }
    h
}

/// Hints from a log file's own name without its extension (`ds_engine_z2_mbs8.log`): the same
/// grammar as folder names. A name without any of its tokens gives nothing.
pub fn from_file_name(path: &Path) -> Hints {
    let mut h = Hints::default();
    if let Some(stem) = path.file_stem() {
        fill_from_name(&mut h, &stem.to_string_lossy());
    }
    h
}

/// What DeepSpeed's printed configuration says.
pub fn from_deepspeed(c: &super::deepspeed::Config) -> Hints {
    let precision = match (c.bf16, c.fp16) {
        (Some(true), _) => Some(Precision::Bf16),
        (_, Some(true)) => Some(Precision::Fp16),
        (Some(false), Some(false)) => Some(Precision::Fp32),
        _ => None,
    };
    // Parameters are offloaded at stage 3 only, so below it the optimizer's setting says all.
    let params = c.offload_param.or(c.stage.filter(|s| *s < 3).map(|_| false));
    let offload = match (c.offload_optimizer, params) {
        (Some(true), Some(true)) => Some(Offload::OptimizerParams),
        (Some(true), _) => Some(Offload::Optimizer),
        (Some(false), Some(false)) => Some(Offload::None),
        _ => None,
    };
    Hints {
        stage: c.stage.and_then(|s| ZeroStage::try_from(s).ok()),
        micro_batch: c.micro_batch,
        grad_accum: c.grad_accum,
        world_size: c.world_size,
        precision,
        offload,
        ..Hints::default()
    }
}

/// Fills what `h` lacks from one name (a folder's or a file's).
fn fill_from_name(h: &mut Hints, name: &str) {
    let c = name.to_ascii_lowercase();
    let cap = |re: &Regex| {
        re.captures(&c).and_then(|m| m.iter().skip(1).flatten().next().and_then(|g| g.as_str().parse::<u32>().ok()))
    };
    if h.stage.is_none() {
        h.stage = cap(&STAGE).and_then(|s| u8::try_from(s).ok()).and_then(|s| ZeroStage::try_from(s).ok());
    }
    h.micro_batch = h.micro_batch.or_else(|| cap(&MBS));
    h.grad_accum = h.grad_accum.or_else(|| cap(&GAS));
    // No run has 0 GPUs or 0 nodes: `gpu0` is a GPU's index (`z2_mbs8_gpu0`), not a count, and
    // figures per GPU would divide by it. Such a count stays unknown.
    h.world_size = h.world_size.or_else(|| cap(&GPUS).filter(|n| *n > 0));
    h.nodes = h.nodes.or_else(|| cap(&NODES).filter(|n| *n > 0));
    if h.offload.is_none() && c.contains("offload") {
        // `no-offload`, `offload_none` and the like say there is none.
        h.offload = Some(if NO_OFFLOAD.is_match(&c) { Offload::None } else { Offload::Optimizer });
    }
    if h.precision.is_none() {
        h.precision = ["bf16", "fp16", "fp32"].iter().find(|p| c.contains(*p)).and_then(|p| p.parse().ok());
    }
    if h.model.is_none() {
        h.model = model_in(&c);
    }
}

/// `offload` negated: a `no`, `non`, `wo` or `without` token before it (`no-offload`,
/// `nooffload`, `without_offload`), or a `none`, `no`, `off`, `false` or `disabled` one after it
/// (`offload-none`, `offload_off`).
static NO_OFFLOAD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?:^|[^\pL\pN])(?:no|non|wo|without)[-_. ]?offload|offload[-_. ]?(?:none|no|off|false|disabled?)(?:$|[^\pL\pN])",
    )
    .expect("valid regex")
});

/// Each model preset's name as a token of a (lower-case) name: the characters before and after
/// it, if any, are neither letters nor digits (so `mlperf` is no `mlp`, `distilgpt2` no `gpt2`,
/// `tinybert` no `tiny`), and the dashes within it may be written `-`, `_` or not at all
/// (`gpt2_xl`, `gpt2xl`, `t5large`).
static PRESETS: LazyLock<Vec<(&'static str, Regex)>> = LazyLock::new(|| {
    ModelPreset::ALL
        .iter()
        .map(|p| {
            let name = p.as_str();
            let parts: Vec<String> = name.split('-').map(regex::escape).collect();
            let re = format!(r"(?:^|[^\pL\pN]){}(?:$|[^\pL\pN])", parts.join("[-_]?"));
            (name, Regex::new(&re).expect("valid regex"))
        })
        .collect()
});

/// The longest model preset name in a folder name, as a token of it, dashes optional.
fn model_in(component: &str) -> Option<String> {
    PRESETS
        .iter()
        .filter(|(_, re)| re.is_match(component))
        .map(|(name, _)| *name)
        .max_by_key(|name| name.len())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_folders() {
        let none = Path::new("");
        let h = from_path(none, Path::new("/x/autotuning/z1_tmbspg3_gas2/t5-large"));
        assert_eq!(h.stage, Some(ZeroStage::Z1));
        assert_eq!(h.micro_batch, Some(3));
        assert_eq!(h.grad_accum, Some(2));
        assert_eq!(h.model.as_deref(), Some("t5-large"));
        let h = from_path(none, Path::new("runs/ds-zero3-offload-t5large-bs32-3gpus-bf16"));
        assert_eq!(h.stage, Some(ZeroStage::Z3));
        assert_eq!(h.offload, Some(Offload::Optimizer));
        assert_eq!(h.micro_batch, Some(32));
        assert_eq!(h.world_size, Some(3));
        assert_eq!(h.precision, Some(Precision::Bf16));
        assert_eq!(h.model.as_deref(), Some("t5-large"));
        assert_eq!(from_path(none, Path::new("gpt2-xl-run")).model.as_deref(), Some("gpt2-xl"));
        // Dashes and underscores alike are left out when names are compared.
        assert_eq!(from_path(none, Path::new("gpt2_xl_run")).model.as_deref(), Some("gpt2-xl"));
        assert_eq!(from_path(none, Path::new("plain")), Hints::default());
    }

    /// A model preset is a whole token of a name: a longer word that begins or ends with one
    /// (`mlperf`, `distilgpt2`, `tinybert`) is another model; a preset's dashes may still be
    /// `_` or left out, and `.` and `/` separate tokens too.
    #[test]
    fn model_presets_are_whole_tokens() {
        for other in [
            "mlperf_bert_z2_mbs8_8gpus",
            "distilgpt2_z2_mbs8_8gpus",
            "tinybert_z2_mbs8_8gpus",
            "gpt2x",
            "xgpt2",
            "mt5-small",
            "t5-smaller",
            "gpt2xl2",
            "bert-base",
        ] {
            assert_eq!(model_in(other), None, "{other}");
        }
        for (name, want) in [
            ("gpt2", "gpt2"),
            ("gpt2xl", "gpt2-xl"),
            ("gpt2_xl_run", "gpt2-xl"),
            ("x.gpt2-medium.y", "gpt2-medium"),
            ("runs/t5large/z2", "t5-large"),
            ("ds-zero3-offload-t5large-bs32", "t5-large"),
            ("z2_mbs8_mlp_1gpus", "mlp"),
            ("tiny_t5_z1", "tiny-t5"),
            ("tiny-llama", "tiny-llama"),
            ("tiny", "tiny"),
            ("mistral7b-bf16", "mistral-7b"),
        ] {
            assert_eq!(model_in(name).as_deref(), Some(want), "{name}");
        }
        assert_eq!(from_path(Path::new(""), Path::new("mlperf_bert_z2_mbs8")).model, None);
    }

    /// `offload` negated (`no-offload`, `offload_none`, ...) is no offload, not optimizer offload;
    /// `offload` alone, or next to another word, is the optimizer's.
    #[test]
    fn offload_negated_in_names_is_none() {
        let offload = |name: &str| from_path(Path::new(""), Path::new(name)).offload;
        for none in [
            "gpt2_z2_mbs8_2gpus_no-offload",
            "no_offload",
            "nooffload",
            "z2-offload-none",
            "offload_none_z2",
            "without-offload",
            "wo_offload",
            "offload-off",
            "offload_false",
        ] {
            assert_eq!(offload(none), Some(Offload::None), "{none}");
        }
        for on in ["z2_offload", "cpu-offload", "cpuoffload", "offload-nodes2", "nano-offload", "two_offload"] {
            assert_eq!(offload(on), Some(Offload::Optimizer), "{on}");
        }
        assert_eq!(offload("z2_mbs8"), None);
    }

    /// A count of 0 GPUs or nodes in a name is no count (`gpu0` is a GPU's index): it stays
    /// unknown, and the rest of the name is still read.
    #[test]
    fn no_count_of_zero_gpus_or_nodes() {
        let none = Path::new("");
        let h = from_path(none, Path::new("z2_mbs8_gpu0"));
        assert_eq!((h.stage, h.micro_batch, h.world_size), (Some(ZeroStage::Z2), Some(8), None));
        assert_eq!(from_path(none, Path::new("0gpus_nodes0")).world_size, None);
        assert_eq!(from_path(none, Path::new("0gpus_nodes0")).nodes, None);
        // A folder nearer the run that says 0 leaves the count to the next one.
        assert_eq!(from_path(none, Path::new("4gpus/z2_gpu0")).world_size, Some(4));
        assert_eq!(from_file_name(Path::new("ds_gpu0.log")).world_size, None);
    }

    /// A hand-written `run.json` that counts 0 GPUs, nodes or sequences: those stay unknown (no
    /// division by 0 downstream), the rest is read, and `zero_counts` names each such key, in
    /// `config` too; a stage of 0 is a stage.
    #[test]
    fn a_count_of_zero_in_run_json_is_unknown_and_named() {
        let v = serde_json::json!({"world_size": 0, "nodes": 1, "stage": 0,
            "config": {"micro_batch": 0, "seq_len": 128, "model": "gpt2"}});
        let h = from_run_json(&v);
        assert_eq!(
            (h.world_size, h.nodes, h.stage, h.micro_batch, h.seq_len),
            (None, Some(1), Some(ZeroStage::Z0), None, Some(128))
        );
        assert_eq!(zero_counts(&v), ["world_size", "config.micro_batch"]);
        assert!(zero_counts(&serde_json::json!({"gpus": 2, "stage": 0})).is_empty());
    }

    /// `gpu3` and `node1` after the word, singular, name a GPU or a node (one rank's log), not a
    /// count; a count comes before the word (`1gpu`, `2node`, `8gpus`) or after a plural (`gpus4`).
    #[test]
    fn an_index_after_gpu_or_node_is_no_count() {
        let none = Path::new("");
        let h = from_path(none, Path::new("z2_mbs8_gpu3"));
        assert_eq!((h.stage, h.micro_batch, h.world_size), (Some(ZeroStage::Z2), Some(8), None));
        assert_eq!(from_file_name(Path::new("ds_node1_gpu7.log")), Hints::default());
        let counts = |name: &str| {
            let h = from_path(none, Path::new(name));
            (h.world_size, h.nodes)
        };
        assert_eq!(counts("1gpu_2node"), (Some(1), Some(2)));
        assert_eq!(counts("gpus4-nodes2"), (Some(4), Some(2)));
        assert_eq!(counts("8gpus/node1_gpu3"), (Some(8), None));
    }

    /// The folders above the root, the root's own name included, say nothing about the run.
    #[test]
    fn only_folders_below_the_root() {
        let root = Path::new("/tmp/.tmp3z2k/z3_mbs64_gpt2-xl_8gpus_bf16");
        assert_eq!(from_path(root, &root.join("plain")), Hints::default());
        assert_eq!(from_path(root, root), Hints::default());
        let h = from_path(root, &root.join("zero1/t5-small"));
        assert_eq!((h.stage, h.micro_batch, h.model.as_deref()), (Some(ZeroStage::Z1), None, Some("t5-small")));
        assert_eq!(from_path(root, Path::new("/elsewhere/z2")), Hints::default());
    }

    /// DeepSpeed offloads parameters at stage 3 only: below it, an optimizer kept on the GPU
    /// means no offload at all; at stage 3 the parameters' line must say.
    #[test]
    fn offload_from_deepspeed_config() {
        use super::super::deepspeed::Config;
        let offload = |stage, offload_param| {
            from_deepspeed(&Config {
                stage: Some(stage),
                offload_optimizer: Some(false),
                offload_param,
                ..Config::default()
            })
            .offload
        };
        assert_eq!(offload(2, None), Some(Offload::None));
        assert_eq!(offload(3, None), None);
        assert_eq!(offload(3, Some(false)), Some(Offload::None));
        let optimizer = Config { stage: Some(2), offload_optimizer: Some(true), ..Config::default() };
        assert_eq!(from_deepspeed(&optimizer).offload, Some(Offload::Optimizer));
        let both =
            Config { stage: Some(3), offload_optimizer: Some(true), offload_param: Some(true), ..Config::default() };
        assert_eq!(from_deepspeed(&both).offload, Some(Offload::OptimizerParams));
    }

    #[test]
    fn run_json_flat_and_nested() {
        let v =
            serde_json::json!({"model": "t5-small", "stage": 1, "micro_batch": 32, "world_size": 3, "seq_len": 512});
        let h = from_run_json(&v);
        assert_eq!(
            (h.stage, h.micro_batch, h.world_size, h.seq_len),
            (Some(ZeroStage::Z1), Some(32), Some(3), Some(512))
        );
        let v = serde_json::json!({"run_id": "r1", "world_size": 2, "nodes": 2, "config": {"model": "gpt2", "stage": 3, "offload": "optimizer"}});
        let h = from_run_json(&v);
        assert_eq!((h.run_id.as_deref(), h.nodes), (Some("r1"), Some(2)));
        assert_eq!(h.model.as_deref(), Some("gpt2"));
        assert_eq!(h.offload, Some(Offload::Optimizer));
        assert_eq!(h.world_size, Some(2));
    }

    /// A hand-written run.json, key by key (it is no RunConfig): DeepSpeed's names too.
    #[test]
    fn run_json_key_by_key() {
        let v = serde_json::json!({"model": "gpt2", "zero_stage": 2, "train_micro_batch_size_per_gpu": 8,
                                   "gradient_accumulation_steps": 4, "precision": "fp16", "offload": "optimizer",
                                   "seq_len": 512, "target_len": 128});
        let h = from_run_json(&v);
        assert_eq!(
            (h.model.as_deref(), h.stage, h.micro_batch, h.grad_accum, h.precision, h.offload),
            (Some("gpt2"), Some(ZeroStage::Z2), Some(8), Some(4), Some(Precision::Fp16), Some(Offload::Optimizer))
        );
        assert_eq!((h.seq_len, h.target_len), (Some(512), Some(128)));
    }

    /// Precision from DeepSpeed's bf16 and fp16 flags: either on names it, both off is fp32,
    /// anything else is not known.
    #[test]
    fn precision_from_deepspeed_flags() {
        use super::super::deepspeed::Config;
        let precision = |bf16, fp16| from_deepspeed(&Config { bf16, fp16, ..Config::default() }).precision;
        assert_eq!(precision(Some(true), Some(false)), Some(Precision::Bf16));
        assert_eq!(precision(Some(false), Some(true)), Some(Precision::Fp16));
        assert_eq!(precision(None, Some(true)), Some(Precision::Fp16));
        assert_eq!(precision(Some(false), Some(false)), Some(Precision::Fp32));
        assert_eq!(precision(Some(false), None), None);
        let h =
            from_deepspeed(&Config { stage: Some(2), micro_batch: Some(8), grad_accum: Some(4), ..Config::default() });
        assert_eq!((h.stage, h.micro_batch, h.grad_accum), (Some(ZeroStage::Z2), Some(8), Some(4)));
    }

    /// The launcher's own run.json: every hint from its configuration and placement, T5's
    /// target length included; another format version is read key by key instead.
    #[test]
    fn the_launchers_run_json_whole() {
        use zerobench_schema::{ModelPreset, RunConfig};
        let mut config = RunConfig::new(ModelPreset::T5Small, ZeroStage::Z3);
        (config.offload, config.precision, config.micro_batch, config.grad_accum, config.seq_len, config.target_len) =
            (Offload::Optimizer, Precision::Fp16, 6, 3, 256, Some(64));
        let record = |format: u32| {
            serde_json::json!({"format": format, "id": "t5-z3", "nodes": 2, "world_size": 8,
                               "config": serde_json::to_value(&config).unwrap(), "cluster": {"partition": "gpu"}})
        };
        let h = from_run_json(&record(zerobench_schema::job::RUN_RECORD_VERSION));
        assert_eq!(
            (h.run_id.as_deref(), h.world_size, h.nodes, h.model.as_deref()),
            (Some("t5-z3"), Some(8), Some(2), Some("t5-small"))
        );
        assert_eq!(
            (h.stage, h.offload, h.precision, h.micro_batch, h.grad_accum, h.seq_len, h.target_len),
            (
                Some(ZeroStage::Z3),
                Some(Offload::Optimizer),
                Some(Precision::Fp16),
                Some(6),
                Some(3),
                Some(256),
                Some(64)
            )
        );
        let other = from_run_json(&record(99));
        assert_eq!((other.world_size, other.nodes, other.stage), (Some(8), Some(2), Some(ZeroStage::Z3)));
    }
}
