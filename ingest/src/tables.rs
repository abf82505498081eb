//! The tables ingest writes, built from the runs:
//! * `latency` and `mem`: the layout of the DeepSpeed profiling studies zerobench grew from
//!   (docs/README.md): one block per ZeRO stage and offload setting (and GPU count, nodes,
//!   precision, sequence length, accumulation and device, so that unlike runs never share a
//!   cell), rows = model and variant (and build, where the runs are of more than one:
//!   [`BuildNames`]; and threads per rank, where runs differ in them alone), columns = micro-batch size; a configuration that ran out of memory shows
//!   `OOM`;
//! * `scaling`: see [`crate::scaling`]; `scaling-pivot`: the same, GPUs as rows and a column group
//!   (samples/s, speedup, efficiency) per ZeRO configuration;
//! * `comm`: one row per run and collective kind;
//! * `runs`: one row per run, every field;
//! * `states`: like `mem`, the model states per rank from the setup records (exact, on CPUs too);
//! * `memory-phases`: DeepSpeed's `see_memory_usage` reports of foreign runs, in order.
//!
//! Every table also exists as a [`Table`] of text cells, which the CSV, Markdown and terminal
//! sinks write.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use zerobench_schema::{Offload, Precision, ZeroStage};

use crate::run::{BuildNames, CollectiveRow, MemoryPhaseRow, RunReport, RunRow, Source, Status};
use crate::scaling::{scaling, ScalingRow};
use crate::stats::median;
pub use zerobench_table::Table;

/// A table of serde rows, with the field names as header (`sample` gives it when there are no
/// rows), each cell the text the CSV file has. Row types are plain structs of scalars, which
/// `every_table_row_type_makes_cells` holds; should one not be, its table is empty.
pub fn table_from_rows<T: Serialize>(name: &'static str, rows: &[T], sample: &T) -> Table {
    Table::from_rows(name, rows, sample).unwrap_or_else(|_| Table { name, header: Vec::new(), rows: Vec::new() })
}

/// What a pivot shows in its cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PivotMetric {
    /// Median step time, ms.
    StepMsMedian,
    /// Peak memory per GPU, GiB: allocated, else NVML used, else process RSS.
    PeakMemoryGib,
    /// Model states per rank, MiB (the largest rank's): what ZeRO partitions, exact, on every
    /// device. MiB, not GiB: the small models of a CPU sweep hold a few MiB, which two decimals
    /// of GiB would show as 0.00 at every stage.
    ModelStateMib,
}

/// The block a run's cell lives in: every axis of a run's identity but the model, the variant
/// (both in the row label) and the micro-batch (the column).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct BlockKey {
    pub stage: ZeroStage,
    /// `None`: not recorded.
    pub offload: Option<Offload>,
    pub gpus: Option<u32>,
    pub nodes: Option<u32>,
    pub precision: Option<Precision>,
    pub seq_len: Option<u32>,
    pub grad_accum: Option<u32>,
    /// The device the run found (a GPU's name).
    pub device: Option<String>,
}

impl BlockKey {
    /// The block's title, in the first column of its header row. Nodes, accumulation and device
    /// are named where they are not the usual (one node, no accumulation) or where the table
    /// holds more than one device (`name_device`).
    pub fn label(&self, name_device: bool) -> String {
        let mut s = format!("zero{}", self.stage);
        match self.offload {
            Some(Offload::None) => {}
            Some(o) => s.push_str(&format!("+offload={o}")),
            None => s.push_str("+offload=?"),
        }
        match self.gpus {
            Some(g) => s.push_str(&format!(" gpus={g}")),
            None => s.push_str(" gpus=?"),
        }
        if let Some(n) = self.nodes.filter(|n| *n != 1) {
            s.push_str(&format!(" nodes={n}"));
        }
        if let Some(p) = self.precision {
            s.push_str(&format!(" {p}"));
        }
        if let Some(t) = self.seq_len {
            s.push_str(&format!(" seq={t}"));
        }
        if let Some(g) = self.grad_accum.filter(|g| *g != 1) {
            s.push_str(&format!(" grad_accum={g}"));
        }
        if name_device {
            s.push_str(&format!(" on {}", self.device.as_deref().unwrap_or("?")));
        }
        s
    }
}

/// Where a memory figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    Allocated,
    Nvml,
    Rss,
    /// The rank's model states (parameters, gradients, optimizer states) from its setup record:
    /// exact, but without activations and buffers.
    ModelStates,
}

/// A figure as the JSON files give it: at the precision every reported figure carries (a DeepSpeed
/// `18.9GB` read as bytes and back is 18.899999999441206 otherwise, where the text shows 18.90).
fn significant<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(crate::stats::round_sig(*x, crate::stats::SIGNIFICANT))
}

/// One cell of a pivot.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Cell {
    /// No run of this configuration.
    Empty,
    /// The median over the `ok` runs of this configuration (repeats of one configuration: the
    /// block, row and column hold every axis of a run's identity), with their range.
    Value {
        #[serde(serialize_with = "significant")]
        value: f64,
        runs: u32,
        #[serde(serialize_with = "significant")]
        min: f64,
        #[serde(serialize_with = "significant")]
        max: f64,
        #[serde(skip_serializing_if = "Option::is_none")]
        memory: Option<MemoryKind>,
    },
    /// Runs finished `ok` but none measured this figure (a foreign log without it).
    NotMeasured,
    /// No run was `ok` and one ran out of memory.
    Oom,
    /// No run was `ok` or `oom`: the most telling other status.
    Other { run_status: Status },
}

impl Cell {
    pub fn text(&self) -> String {
        match self {
            Cell::Empty => String::new(),
            Cell::Value { value, memory, runs, min, max } => {
                let mut s = format!("{value:.2}");
                match memory {
                    None | Some(MemoryKind::Allocated) => {}
                    Some(MemoryKind::Nvml) => s.push_str(" nvml"),
                    Some(MemoryKind::Rss) => s.push_str(" rss"),
                    Some(MemoryKind::ModelStates) => s.push_str(" states"),
                }
                if *runs > 1 {
                    s.push_str(&format!(" (n={runs} {min:.2}..{max:.2})"));
                }
                s
            }
            Cell::NotMeasured => "n/a".into(),
            Cell::Oom => "OOM".into(),
            Cell::Other { run_status } => run_status.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PivotRow {
    pub model: String,
    pub cells: Vec<Cell>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PivotBlock {
    #[serde(flatten)]
    pub key: BlockKey,
    pub label: String,
    /// Micro-batch sizes, one per cell.
    pub micro_batches: Vec<u32>,
    pub rows: Vec<PivotRow>,
}

/// A latency or memory table in the profiling studies' layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pivot {
    pub name: &'static str,
    pub metric: PivotMetric,
    pub blocks: Vec<PivotBlock>,
}

impl Pivot {
    fn build(name: &'static str, metric: PivotMetric, runs: &[RunReport]) -> Pivot {
        let mut cells: BTreeMap<BlockKey, BTreeMap<String, BTreeMap<u32, Vec<&RunRow>>>> = BTreeMap::new();
        let devices: BTreeSet<Option<&str>> = runs.iter().map(|r| r.row.gpu.as_deref()).collect();
        let builds = BuildNames::of(runs.iter().map(|r| &r.row));
        // Rows in order of model size (t5-large before t5-3b), then by label.
        let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
        // Runs of one configuration but their threads are no repeats of each other: where the
        // table holds such runs, every zerobench row names its threads.
        let name_threads = {
            let mut seen: BTreeMap<(BlockKey, u32, &str, &str, String), Option<u32>> = BTreeMap::new();
            runs.iter().map(|r| &r.row).filter(|r| r.source == Source::Zerobench).any(|row| {
                block_of(row).is_some_and(|(key, mbs)| {
                    let cell = (key, mbs, row.model.as_str(), row.variant.as_str(), builds.name(row));
                    *seen.entry(cell).or_insert(row.threads) != row.threads
                })
            })
        };
        for r in runs {
            let row = &r.row;
            let Some((key, mbs)) = block_of(row) else { continue };
            let mut label = match row.source {
                Source::Zerobench => row.model.clone(),
                Source::Foreign => format!("{} ({})", row.model, row.formats),
            };
            let mut settings: Vec<String> = Vec::new();
            if !row.variant.is_empty() {
                settings.push(row.variant.clone());
            }
            if let Some(t) = row.threads.filter(|_| name_threads && row.source == Source::Zerobench) {
                settings.push(format!("threads={t}"));
            }
            if !settings.is_empty() {
                label.push_str(&format!(" [{}]", settings.join(",")));
            }
            label.push_str(&BuildNames::suffix(&builds.name(row)));
            sizes.entry(label.clone()).or_insert_with(|| model_size(&row.model));
            cells.entry(key).or_default().entry(label).or_default().entry(mbs).or_default().push(row);
        }
        // Every block has the same columns, so the stacked blocks stay one rectangular table.
        let columns: Vec<u32> = cells
            .values()
            .flat_map(|models| models.values().flat_map(|m| m.keys().copied()))
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        let blocks = cells
            .into_iter()
            .map(|(key, models)| PivotBlock {
                label: key.label(devices.len() > 1),
                key,
                micro_batches: columns.clone(),
                rows: {
                    let mut models: Vec<_> = models.into_iter().collect();
                    models.sort_by_key(|(label, _)| (sizes.get(label).copied().unwrap_or(u64::MAX), label.clone()));
                    models
                }
                .into_iter()
                .map(|(model, by_mbs)| PivotRow {
                    model,
                    cells: columns.iter().map(|m| cell(metric, by_mbs.get(m).map_or(&[][..], |v| v))).collect(),
                })
                .collect(),
            })
            .collect();
        Pivot { name, metric, blocks }
    }

    /// The pivot as stacked blocks, each headed by its label and the micro-batch sizes.
    pub fn to_table(&self) -> Table {
        let mut rows: Vec<Vec<String>> = Vec::new();
        for b in &self.blocks {
            let mut head = vec![b.label.clone()];
            head.extend(b.micro_batches.iter().map(u32::to_string));
            rows.push(head);
            for r in &b.rows {
                let mut line = vec![r.model.clone()];
                line.extend(r.cells.iter().map(Cell::text));
                rows.push(line);
            }
        }
        let header = if rows.is_empty() { Vec::new() } else { rows.remove(0) };
        Table { name: self.name, header, rows }
    }
}

/// The block a run's cell is in, and its column (the micro-batch); `None` for a run of unknown
/// stage or micro-batch, which is in no pivot.
fn block_of(row: &RunRow) -> Option<(BlockKey, u32)> {
    let (Some(stage), Some(mbs)) = (row.stage, row.micro_batch) else { return None };
    let key = BlockKey {
        stage,
        offload: row.offload,
        gpus: row.gpus,
        nodes: row.nodes,
        precision: row.precision,
        seq_len: row.seq_len,
        grad_accum: row.grad_accum,
        device: row.gpu.clone(),
    };
    Some((key, mbs))
}

const GIB: f64 = (1u64 << 30) as f64;

/// A model's parameter count when it names a preset; unknown models sort last.
fn model_size(model: &str) -> u64 {
    zerobench_schema::ModelPreset::from_name(model).map_or(u64::MAX, |p| p.spec().param_count())
}

fn memory_of(row: &RunRow) -> Option<(f64, MemoryKind)> {
    if let Some(b) = row.peak_allocated_bytes {
        return Some((b as f64 / GIB, MemoryKind::Allocated));
    }
    if let Some(b) = row.peak_nvml_used_bytes {
        return Some((b as f64 / GIB, MemoryKind::Nvml));
    }
    row.peak_rss_bytes.map(|b| (b as f64 / GIB, MemoryKind::Rss))
}

fn cell(metric: PivotMetric, runs: &[&RunRow]) -> Cell {
    if runs.is_empty() {
        return Cell::Empty;
    }
    let ok: Vec<&&RunRow> = runs.iter().filter(|r| r.status == Status::Ok).collect();
    let values: Vec<(f64, Option<MemoryKind>)> = ok
        .iter()
        .filter_map(|r| match metric {
            PivotMetric::StepMsMedian => r.step_ms_median.map(|v| (v, None)),
            PivotMetric::PeakMemoryGib => memory_of(r).map(|(v, k)| (v, Some(k))),
            PivotMetric::ModelStateMib => {
                r.state_bytes().map(|b| (b as f64 / f64::from(1u32 << 20), Some(MemoryKind::ModelStates)))
            }
        })
        .collect();
    if !values.is_empty() {
        // Mixed memory sources in one cell: show the most direct one present.
        let kind = values.iter().filter_map(|(_, k)| *k).min();
        let vals: Vec<f64> = values.iter().filter(|(_, k)| *k == kind).map(|(v, _)| *v).collect();
        let (min, max) = vals.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
        return Cell::Value { value: median(&vals).unwrap_or(0.0), runs: vals.len() as u32, min, max, memory: kind };
    }
    if !ok.is_empty() {
        return Cell::NotMeasured;
    }
    if runs.iter().any(|r| r.status == Status::Oom) {
        return Cell::Oom;
    }
    // Prefer the status that explains most: failed, then timeout, cancelled, incomplete.
    let order = [Status::Failed, Status::Timeout, Status::Cancelled, Status::Incomplete];
    let run_status = order.into_iter().find(|s| runs.iter().any(|r| r.status == *s)).unwrap_or(Status::Incomplete);
    Cell::Other { run_status }
}

/// Every table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tables {
    pub latency: Pivot,
    pub mem: Pivot,
    /// Model states per rank: what ZeRO saves, exact, on CPUs too (where `mem` is process RSS).
    pub states: Pivot,
    pub scaling: Vec<ScalingRow>,
    pub comm: Vec<CollectiveRow>,
    pub runs: Vec<RunRow>,
    /// DeepSpeed's `see_memory_usage` progression of every foreign run that prints it.
    pub memory_phases: Vec<MemoryPhaseRow>,
    /// Runs against a cost model's predictions; empty (and not written) unless a caller fills it.
    pub predicted: Vec<crate::predicted::PredictedRow>,
    /// The model's stage choice over groups of those runs; likewise.
    pub stage_choice: Vec<crate::predicted::StageChoiceRow>,
}

impl Tables {
    /// The tables of `runs`, with every figure rounded to [`crate::stats::SIGNIFICANT`] digits.
    pub fn build(runs: &[RunReport]) -> Tables {
        // Figures are computed at full precision and rounded for output only.
        let rounded: Vec<RunReport> = runs.iter().cloned().map(RunReport::round).collect();
        Tables {
            latency: Pivot::build("latency", PivotMetric::StepMsMedian, &rounded),
            mem: Pivot::build("mem", PivotMetric::PeakMemoryGib, &rounded),
            states: Pivot::build("states", PivotMetric::ModelStateMib, &rounded),
            scaling: scaling(runs),
            comm: rounded.iter().flat_map(|r| r.collectives.iter().cloned()).collect(),
            memory_phases: rounded.iter().flat_map(|r| r.memory_phases.iter().cloned()).collect(),
            predicted: Vec::new(),
            stage_choice: Vec::new(),
            runs: rounded.into_iter().map(|r| r.row).collect(),
        }
    }

    /// Every table as text cells, in the order they are written.
    pub fn text_tables(&self) -> Vec<Table> {
        vec![
            self.latency.to_table(),
            self.mem.to_table(),
            self.states.to_table(),
            table_from_rows("scaling", &self.scaling, &ScalingRow::default()),
            crate::scaling::scaling_pivot(&self.scaling),
            table_from_rows("comm", &self.comm, &CollectiveRow::default()),
            table_from_rows("runs", &self.runs, &RunRow::default()),
            table_from_rows("memory-phases", &self.memory_phases, &MemoryPhaseRow::default()),
        ]
        .into_iter()
        .chain(
            (!self.predicted.is_empty())
                .then(|| table_from_rows("predicted", &self.predicted, &crate::predicted::PredictedRow::default())),
        )
        .chain(
            (!self.stage_choice.is_empty()).then(|| {
                table_from_rows("stage-choice", &self.stage_choice, &crate::predicted::StageChoiceRow::default())
            }),
        )
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row type of a table is a plain struct of scalars: it makes cells, and its header is
    /// the CSV file's (the CSV writer and the text tables agree on every column).
    #[test]
    fn every_table_row_type_makes_cells() {
        fn check<T: Serialize + Default>(name: &'static str) -> Vec<String> {
            let t = Table::from_rows(name, &[T::default(), T::default()], &T::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut w = csv::WriterBuilder::new().has_headers(true).from_writer(Vec::new());
            w.serialize(T::default()).unwrap();
            let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
            let header = text.lines().next().unwrap();
            assert_eq!(t.header.join(","), header, "{name}");
            assert!(t.rows.iter().all(|r| r.len() == t.header.len()), "{name}");
            t.header
        }
        // A scaling row holds its group flattened (serde's flatten, which the CSV writer refuses):
        // the group's columns as the CSV writer writes them, then the point's, none twice.
        let group = check::<crate::scaling::ScalingGroup>("scaling group");
        assert!(!group.iter().any(|c| c == "threads"), "{group:?}");
        let scaling = Table::from_rows("scaling", &[ScalingRow::default()], &ScalingRow::default()).unwrap();
        assert_eq!(scaling.header[..group.len()], group);
        let point = [
            "gpus",
            "nodes",
            "threads",
            "runs",
            "samples_per_s",
            "tokens_per_s",
            "samples_per_s_per_gpu",
            "baseline_gpus",
            "speedup",
            "ideal_speedup",
            "efficiency",
            "comm_frac",
        ];
        assert_eq!(scaling.header[group.len()..], point);
        assert_eq!(scaling.rows[0].len(), scaling.header.len());
        check::<CollectiveRow>("comm");
        check::<RunRow>("runs");
        check::<MemoryPhaseRow>("memory-phases");
        check::<crate::predicted::PredictedRow>("predicted");
        check::<crate::predicted::StageChoiceRow>("stage-choice");
    }

    /// A block's rows go by model size, not by name: gpt2-medium before gpt2-large before
    /// gpt2-xl, and a model no preset names last.
    #[test]
    fn pivot_rows_go_by_model_size() {
        let report = |model: &str| RunReport {
            row: RunRow {
                run_id: model.into(),
                model: model.into(),
                stage: Some(ZeroStage::Z2),
                micro_batch: Some(4),
                ..RunRow::default()
            },
            collectives: Vec::new(),
            memory_phases: Vec::new(),
        };
        let runs: Vec<RunReport> = ["gpt2-xl", "my-model", "gpt2-large", "gpt2-medium"].map(report).into();
        let pivot = Pivot::build("latency", PivotMetric::StepMsMedian, &runs);
        let order: Vec<&str> = pivot.blocks[0].rows.iter().map(|r| r.model.as_str()).collect();
        assert_eq!(order, ["gpt2-medium", "gpt2-large", "gpt2-xl", "my-model"]);
    }

    /// Repeats of one configuration by two builds are two rows of the latency table and two
    /// scaling lines, each named by its commit; by one build they pool, and no row names it.
    #[test]
    fn runs_of_different_builds_never_pool() {
        let report = |commit: &str, gpus: u32, step_ms: f64| RunReport {
            row: RunRow {
                run_id: format!("{commit}-{gpus}"),
                source: Source::Zerobench,
                model: "gpt2".into(),
                stage: Some(ZeroStage::Z2),
                micro_batch: Some(4),
                gpus: Some(gpus),
                commit: Some(commit.into()),
                status: Status::Ok,
                step_ms_median: Some(step_ms),
                samples_per_s: Some(4.0 * f64::from(gpus) / step_ms),
                ..RunRow::default()
            },
            collectives: Vec::new(),
            memory_phases: Vec::new(),
        };
        let (a, b) = ("aaaaaaaa11111111", "bbbbbbbb22222222");
        let runs = [report(a, 1, 100.0), report(b, 1, 80.0), report(a, 2, 110.0), report(b, 2, 84.0)];
        let pivot = Pivot::build("latency", PivotMetric::StepMsMedian, &runs);
        let one_gpu: Vec<(&str, String)> =
            pivot.blocks[0].rows.iter().map(|r| (r.model.as_str(), r.cells[0].text())).collect();
        assert_eq!(one_gpu, [("gpt2 @aaaaaaa", "100.00".to_string()), ("gpt2 @bbbbbbb", "80.00".to_string())]);
        let lines: Vec<(String, u32, f64)> =
            scaling(&runs).iter().map(|r| (r.group.build.clone(), r.gpus, r.speedup)).collect();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines.iter().filter(|l| l.0 == "aaaaaaa").count(), 2, "{lines:?}");
        // Each build's 2-GPU point against its own 1-GPU baseline: 2·100/110 and 2·80/84.
        for (build, base, two) in [("aaaaaaa", 100.0, 110.0), ("bbbbbbb", 80.0, 84.0)] {
            let l = lines.iter().find(|l| l.0 == build && l.1 == 2).unwrap();
            assert!((l.2 - 2.0 * base / two).abs() < 1e-3, "{l:?}");
        }
        // One build: the cells pool (two runs, their median) and nothing names the build.
        let one = [report(a, 1, 100.0), report(a, 1, 80.0)];
        let pivot = Pivot::build("latency", PivotMetric::StepMsMedian, &one);
        assert_eq!(pivot.blocks[0].rows[0].model, "gpt2");
        assert_eq!(pivot.blocks[0].rows[0].cells[0].text(), "90.00 (n=2 80.00..100.00)");
        assert!(scaling(&one).iter().all(|r| r.group.build.is_empty()));
        // A log's commit is text: a multi-byte one is cut by characters, and one missing is `?`.
        let mut odd = [report("ççççççççç", 1, 100.0), report(a, 1, 80.0)];
        odd[1].row.commit = None;
        let labels: Vec<String> = Pivot::build("latency", PivotMetric::StepMsMedian, &odd).blocks[0]
            .rows
            .iter()
            .map(|r| r.model.clone())
            .collect();
        assert_eq!(labels, ["gpt2 @?", "gpt2 @ççççççç"]);
    }

    /// A run's peak memory in GiB: allocated, else NVML's used bytes, else the process's RSS.
    #[test]
    fn memory_falls_back_in_order() {
        let mut row = RunRow { peak_rss_bytes: Some(1 << 30), ..RunRow::default() };
        assert_eq!(memory_of(&row), Some((1.0, MemoryKind::Rss)));
        row.peak_nvml_used_bytes = Some(3 << 30);
        assert_eq!(memory_of(&row), Some((3.0, MemoryKind::Nvml)));
        row.peak_allocated_bytes = Some(5 << 29);
        assert_eq!(memory_of(&row), Some((2.5, MemoryKind::Allocated)));
    }
}
