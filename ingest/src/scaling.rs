//! Scaling: throughput against the number of GPUs, for each model and ZeRO configuration.
//!
//! zerobench fixes the micro-batch per GPU, so the global batch grows with the GPUs: this is weak
//! scaling. With X(N) the throughput (samples/s) on N GPUs and N₀ the smallest GPU count measured
//! for the same model, stage, offload, precision, sequence length, micro-batch and gradient
//! accumulation:
//! * speedup S(N) = X(N) / X(N₀), ideal = N / N₀, efficiency E(N) = S(N) / ideal
//!   = (X(N)/N) / (X(N₀)/N₀), which equals T_step(N₀)/T_step(N) since work per GPU is constant.
//!
//! With N₀ = 1 these are the usual speedup and efficiency against one GPU; the baseline is
//! printed in every row. Runs that are not `ok` are left out; repeated runs of one configuration
//! and GPU count are combined by their median throughput. Nodes are part of the row, so the same
//! GPU count on one node and on two shows as two rows (intra- against inter-node).
//!
//! Runs that differ in their threads per rank alone are no repeats of each other. Where a group's
//! runs at one GPU count differ in them, the group is split into a line per thread count, each
//! with its own baseline; otherwise (the usual CPU study, whose ranks divide the host's cores, so
//! the threads per rank fall as the ranks grow) the group stays one line and each row names its
//! runs' threads.

use std::collections::BTreeMap;

use serde::Serialize;
use zerobench_schema::{Offload, Precision, ZeroStage};

use crate::aggregate::usable_for_scaling;
use crate::run::{BuildNames, RunReport, RunRow, Source};
use crate::stats::median;

/// One row of the scaling table: a point (GPUs and nodes) of a group's line.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScalingRow {
    /// The group the row is a point of, its first columns; the plots draw a group's rows as one
    /// line.
    #[serde(flatten)]
    pub group: ScalingGroup,
    pub gpus: u32,
    pub nodes: Option<u32>,
    /// Intra-op threads per rank of the runs combined (they all have it; none for foreign runs).
    pub threads: Option<u32>,
    /// Runs combined into this row.
    pub runs: u32,
    pub samples_per_s: f64,
    pub tokens_per_s: Option<f64>,
    pub samples_per_s_per_gpu: f64,
    pub baseline_gpus: u32,
    pub speedup: f64,
    pub ideal_speedup: f64,
    pub efficiency: f64,
    pub comm_frac: Option<f64>,
}

impl ScalingRow {
    fn round(&mut self) {
        use crate::stats::{round_opt, round_sig, SIGNIFICANT};
        for x in [
            &mut self.samples_per_s,
            &mut self.samples_per_s_per_gpu,
            &mut self.speedup,
            &mut self.ideal_speedup,
            &mut self.efficiency,
        ] {
            *x = round_sig(*x, SIGNIFICANT);
        }
        round_opt(&mut self.tokens_per_s);
        round_opt(&mut self.comm_frac);
    }
}

/// A scaling group: every axis of a run's identity but its GPU and node counts (the device too:
/// runs on two kinds of GPU are two lines). Its runs are one line of the scaling table's speedups
/// and one line of each plot.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ScalingGroup {
    pub model: String,
    /// Non-default optimizer and engine settings (`RunConfig::variant`).
    pub variant: String,
    /// The runs' build where the set holds more than one (a commit's first 7 digits, `?` for logs
    /// that name none: [`BuildNames::name`]); empty otherwise.
    pub build: String,
    pub source: Source,
    /// The device the runs found (a GPU's name).
    pub gpu: Option<String>,
    pub stage: Option<ZeroStage>,
    pub offload: Option<Offload>,
    pub precision: Option<Precision>,
    pub seq_len: Option<u32>,
    pub micro_batch: Option<u32>,
    pub grad_accum: Option<u32>,
    /// The threads per rank of the group's runs, where runs of the group at one GPU count differ
    /// in them (a line per thread count); `None` otherwise, and always from [`ScalingGroup::of`].
    /// No column: the row's own `threads` says it.
    #[serde(skip)]
    pub threads: Option<u32>,
}

impl ScalingGroup {
    /// The group of `row`, with its build named as `builds` (those of every run read) names it.
    pub fn of(row: &RunRow, builds: &BuildNames) -> ScalingGroup {
        ScalingGroup {
            model: row.model.clone(),
            variant: row.variant.clone(),
            build: builds.name(row),
            source: row.source,
            gpu: row.gpu.clone(),
            stage: row.stage,
            offload: row.offload,
            precision: row.precision,
            seq_len: row.seq_len,
            micro_batch: row.micro_batch,
            grad_accum: row.grad_accum,
            threads: None,
        }
    }
}

/// Runs of one group by (GPUs, nodes).
type Groups<'a> = BTreeMap<ScalingGroup, BTreeMap<(u32, Option<u32>), Vec<&'a RunReport>>>;

/// The runs of one group at one (GPUs, nodes), combined.
struct Point {
    gpus: u32,
    nodes: Option<u32>,
    threads: Option<u32>,
    runs: u32,
    samples_per_s: f64,
    tokens_per_s: Option<f64>,
    comm_frac: Option<f64>,
}

/// The scaling table of a set of runs.
pub fn scaling(runs: &[RunReport]) -> Vec<ScalingRow> {
    let mut groups = Groups::new();
    let builds = BuildNames::of(runs.iter().map(|r| &r.row));
    for r in runs {
        let row = &r.row;
        let (Some(gpus), Some(_)) = (row.gpus, row.samples_per_s) else { continue };
        if !usable_for_scaling(row.status) || gpus == 0 {
            continue;
        }
        groups.entry(ScalingGroup::of(row, &builds)).or_default().entry((gpus, row.nodes)).or_default().push(r);
    }
    let mut out = Vec::new();
    for (group, points) in split_by_threads(groups) {
        let combined: Vec<Point> = points
            .into_iter()
            .map(|((gpus, nodes), rs)| Point {
                gpus,
                nodes,
                // One value: the points of a group whose runs differ in threads were split.
                threads: rs.first().and_then(|r| r.row.threads),
                runs: rs.len() as u32,
                samples_per_s: median(&rs.iter().filter_map(|r| r.row.samples_per_s).collect::<Vec<_>>())
                    .unwrap_or(0.0),
                tokens_per_s: median(&rs.iter().filter_map(|r| r.row.tokens_per_s).collect::<Vec<_>>()),
                comm_frac: median(&rs.iter().filter_map(|r| r.row.comm_frac).collect::<Vec<_>>()),
            })
            .collect();
        // The baseline is the smallest GPU count, on the fewest nodes (the map is sorted so).
        let Some((base_gpus, base_sps)) = combined.first().map(|p| (p.gpus, p.samples_per_s)) else { continue };
        for Point { gpus, nodes, threads, runs: n, samples_per_s: sps, tokens_per_s: tps, comm_frac: comm } in combined
        {
            let speedup = if base_sps > 0.0 { sps / base_sps } else { 0.0 };
            let ideal = f64::from(gpus) / f64::from(base_gpus);
            out.push(ScalingRow {
                group: group.clone(),
                gpus,
                nodes,
                threads,
                runs: n,
                samples_per_s: sps,
                tokens_per_s: tps,
                samples_per_s_per_gpu: sps / f64::from(gpus),
                baseline_gpus: base_gpus,
                speedup,
                ideal_speedup: ideal,
                efficiency: speedup / ideal,
                comm_frac: comm,
            });
            if let Some(last) = out.last_mut() {
                last.round();
            }
        }
    }
    out
}

/// Splits each group whose runs at one GPU count (and node count) differ in their threads into a
/// group per thread count; the others are left whole.
fn split_by_threads(groups: Groups<'_>) -> Groups<'_> {
    let mut out = Groups::new();
    for (group, points) in groups {
        let mixed = points.values().any(|rs| rs.iter().any(|r| r.row.threads != rs[0].row.threads));
        if !mixed {
            out.insert(group, points);
            continue;
        }
        for (place, rs) in points {
            for r in rs {
                let line = ScalingGroup { threads: r.row.threads, ..group.clone() };
                out.entry(line).or_default().entry(place).or_default().push(r);
            }
        }
    }
    out
}

/// The scaling table pivoted as the GPT-2 framework comparison lays it out: one block per model
/// and the axes its runs share (micro-batch, sequence, precision, accumulation, device, variant),
/// GPUs (and nodes) as rows, and per ZeRO configuration (stage, offload, source) a column group of
/// samples/s, speedup against the fewest GPUs, and efficiency.
pub fn scaling_pivot(rows: &[ScalingRow]) -> zerobench_table::Table {
    use std::collections::BTreeSet;
    type Block = (String, Option<u32>, Option<u32>, Option<Precision>, Option<u32>, Option<String>, String, String);
    let mut blocks: BTreeMap<Block, Vec<&ScalingRow>> = BTreeMap::new();
    for r in rows {
        let g = &r.group;
        let key = (
            g.model.clone(),
            g.micro_batch,
            g.seq_len,
            g.precision,
            g.grad_accum,
            g.gpu.clone(),
            g.variant.clone(),
            g.build.clone(),
        );
        blocks.entry(key).or_default().push(r);
    }
    let config = |r: &ScalingRow| {
        let g = &r.group;
        let mut s = g.stage.map_or("zero?".to_string(), |s| format!("zero{s}"));
        match g.offload {
            Some(Offload::None) => {}
            Some(o) => s.push_str(&format!("+{o}")),
            None => s.push_str("+offload?"),
        }
        if let Some(t) = g.threads {
            s.push_str(&format!(" threads={t}"));
        }
        if g.source != Source::Zerobench {
            s.push_str(&format!(" ({})", g.source));
        }
        s
    };
    let opt = |v: Option<u32>| v.map_or("?".to_string(), |v| v.to_string());
    let mut out: Vec<Vec<String>> = Vec::new();
    for ((model, mbs, seq, precision, ga, gpu, variant, build), rs) in blocks {
        let configs: Vec<String> = rs.iter().map(|r| config(r)).collect::<BTreeSet<_>>().into_iter().collect();
        let mut label = format!("{model} mbs={} seq={}", opt(mbs), opt(seq));
        if let Some(p) = precision {
            label.push_str(&format!(" {p}"));
        }
        if let Some(g) = ga.filter(|g| *g != 1) {
            label.push_str(&format!(" grad_accum={g}"));
        }
        if let Some(g) = gpu {
            label.push_str(&format!(" on {g}"));
        }
        if !variant.is_empty() {
            label.push_str(&format!(" [{variant}]"));
        }
        label.push_str(&BuildNames::suffix(&build));
        let mut head = vec![label, "nodes".to_string()];
        for c in &configs {
            head.extend([format!("{c} samples/s"), format!("{c} speedup"), format!("{c} efficiency")]);
        }
        out.push(head);
        let places: BTreeSet<(u32, Option<u32>)> = rs.iter().map(|r| (r.gpus, r.nodes)).collect();
        for (gpus, nodes) in places {
            let mut line = vec![gpus.to_string(), opt(nodes)];
            for c in &configs {
                match rs.iter().find(|r| r.gpus == gpus && r.nodes == nodes && config(r) == *c) {
                    Some(r) => line.extend([
                        format!("{:.1}", r.samples_per_s),
                        format!("{:.3}", r.speedup),
                        format!("{:.3}", r.efficiency),
                    ]),
                    None => line.extend([String::new(), String::new(), String::new()]),
                }
            }
            out.push(line);
        }
    }
    // Blocks differ in width: pad every row to the widest, so the stack stays one table.
    let width = out.iter().map(Vec::len).max().unwrap_or(0);
    for r in &mut out {
        r.resize(width, String::new());
    }
    let header = if out.is_empty() { Vec::new() } else { out.remove(0) };
    zerobench_table::Table { name: "scaling-pivot", header, rows: out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{RunRow, Status};

    /// A baseline that did no work (a foreign log reporting 0 samples/s) gives no speedup rather
    /// than an infinite one; a working baseline gives the ratio.
    #[test]
    fn a_baseline_of_no_throughput_gives_no_speedup() {
        let report = |gpus: u32, sps: f64| {
            let mut row = RunRow::new(format!("g{gpus}"), Source::Foreign, "d".into(), "gpt2".into(), Status::Ok);
            (row.gpus, row.samples_per_s) = (Some(gpus), Some(sps));
            RunReport { row, collectives: Vec::new(), memory_phases: Vec::new() }
        };
        let speedups = |base: f64| -> Vec<f64> {
            scaling(&[report(1, base), report(2, 30.0)]).iter().map(|r| r.speedup).collect()
        };
        assert_eq!(speedups(0.0), [0.0, 0.0]);
        assert_eq!(speedups(20.0), [1.0, 1.5]);
    }

    /// Runs that differ in their threads per rank alone are not pooled: a GPU count with runs of
    /// 4 and of 8 threads splits the group into a line per thread count, each its own baseline.
    /// Where each GPU count has one thread count (ranks dividing a host's cores), the group stays
    /// one line and each row names its threads.
    #[test]
    fn runs_of_other_threads_are_no_repeats() {
        let report = |gpus: u32, threads: u32, sps: f64| {
            let mut row =
                RunRow::new(format!("g{gpus}t{threads}"), Source::Zerobench, "d".into(), "gpt2".into(), Status::Ok);
            (row.gpus, row.threads, row.samples_per_s) = (Some(gpus), Some(threads), Some(sps));
            RunReport { row, collectives: Vec::new(), memory_phases: Vec::new() }
        };
        // (GPUs, the row's threads, the line's threads, samples/s, speedup)
        type Row = (u32, Option<u32>, Option<u32>, f64, f64);
        let rows = |runs: &[RunReport]| -> Vec<Row> {
            scaling(runs).iter().map(|r| (r.gpus, r.threads, r.group.threads, r.samples_per_s, r.speedup)).collect()
        };
        let mixed = [report(1, 4, 10.0), report(1, 8, 16.0), report(2, 4, 18.0)];
        assert_eq!(
            rows(&mixed),
            [(1, Some(4), Some(4), 10.0, 1.0), (2, Some(4), Some(4), 18.0, 1.8), (1, Some(8), Some(8), 16.0, 1.0)]
        );
        let divided = [report(1, 8, 10.0), report(2, 4, 18.0), report(2, 4, 20.0)];
        assert_eq!(rows(&divided), [(1, Some(8), None, 10.0, 1.0), (2, Some(4), None, 19.0, 1.9)]);
        let pivot = scaling_pivot(&scaling(&mixed));
        assert!(pivot.header.iter().any(|h| h == "zero?+offload? threads=8 samples/s"), "{:?}", pivot.header);
    }
}
