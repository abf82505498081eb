//! SVG plots (plotters, SVG backend, no system fonts needed):
//! * `throughput-<model>.svg`: samples/s against GPUs, one line per scaling group (the scaling
//!   table's: [`ScalingGroup`], so runs of another stage, offload, precision, sequence length,
//!   accumulation, source, device, variant or build are never one line);
//! * `memory-<model>-mbs<N>.svg`: peak memory per GPU against GPUs, one line per scaling group,
//!   for one model and micro-batch size (from the runs that finished `ok`): how much each stage
//!   saves as GPUs are added;
//! * `step-breakdown.svg`: per run, its median step split into disjoint parts (forward and
//!   backward computation, exposed communication, optimizer, the rest) by their shares of the
//!   measured time, stacked: each bar is the median step;
//! * `predicted-vs-measured.svg`: each run's predicted step time against its measured one, with
//!   the diagonal and ±10% lines (when a cost model's predictions were added).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::ReportError;
use crate::run::{BuildNames, RunRow, Status};
use crate::scaling::ScalingGroup;
use crate::tables::Tables;

const SIZE: (u32, u32) = (900, 540);

/// Draws every plot; returns the files written and the plots that could not be (each a problem
/// of its own: one run's plot does not keep the others from being drawn).
pub fn write(tables: &Tables, out: &Path) -> (Vec<PathBuf>, Vec<ReportError>) {
    let mut failed = Vec::new();
    let mut written = throughput(tables, out, &mut failed);
    written.extend(memory(tables, out, &mut failed));
    match breakdown(&tables.runs, out) {
        Ok(Some(p)) => written.push(p),
        Ok(None) => {}
        Err(e) => failed.push(e),
    }
    if !tables.predicted.is_empty() {
        let path = out.join("predicted-vs-measured.svg");
        match predicted_vs_measured(&path, &tables.predicted) {
            Ok(()) => written.push(path),
            Err(e) => failed.push(err(&path)(e)),
        }
    }
    (written, failed)
}

/// Predicted against measured step time, one point per run, log-log, with y = x and ±10%.
fn predicted_vs_measured(path: &Path, rows: &[crate::predicted::PredictedRow]) -> Result<(), String> {
    let points: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| Some((r.step_ms?, r.predicted_step_ms?)))
        .filter(|(m, p)| *m > 0.0 && *p > 0.0 && m.is_finite() && p.is_finite())
        .collect();
    let (lo, hi) = log_range(points.iter().flat_map(|(m, p)| [*m, *p]));
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption("cost model: predicted against measured step time", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("measured ms").y_desc("predicted ms").draw().map_err(|e| e.to_string())?;
    for (k, style) in
        [(1.0, BLACK.stroke_width(1)), (1.1, BLACK.mix(0.4).stroke_width(1)), (0.9, BLACK.mix(0.4).stroke_width(1))]
    {
        chart.draw_series(LineSeries::new(ratio_line(lo, hi, k), style)).map_err(|e| e.to_string())?;
    }
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 4, Palette99::pick(0).to_rgba().filled())))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Both axes of the predicted-against-measured plot: from 20% below the smallest value (and
/// below 1 ms) to 25% above the largest, at least a factor of two wide.
fn log_range(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let lo = values.clone().fold(f64::INFINITY, f64::min).min(1.0) * 0.8;
    let hi = values.fold(0.0f64, f64::max).max(lo * 2.0) * 1.25;
    (lo, hi)
}

/// The ends of the line predicted = `k` × measured across `[lo, hi]`.
fn ratio_line(lo: f64, hi: f64, k: f64) -> [(f64, f64); 2] {
    [(lo, lo * k), (hi, hi * k)]
}

/// Longest file-name form of a label: file systems take 255 bytes per name.
const MAX_SLUG: usize = 80;

/// A file-name-safe form of a model label; a long one is cut and told apart by a hash of the
/// whole label.
fn slug(s: &str) -> String {
    let t: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
    let t = t.trim_matches('_').to_string();
    if t.len() <= MAX_SLUG {
        return t;
    }
    // A fixed hash: the same file name on every machine and in every build.
    let h = zerobench_schema::fnv::fnv1a(s.as_bytes());
    format!("{}-{h:016x}", &t[..MAX_SLUG])
}

fn err(path: &Path) -> impl Fn(String) -> ReportError + '_ {
    move |message| ReportError::Plot { path: path.to_path_buf(), message }
}

type Series = Vec<(String, Vec<(f64, f64)>)>;
/// Points of a chart by scaling group: (GPUs, nodes) and the value.
type Lines = BTreeMap<ScalingGroup, Vec<((u32, Option<u32>), f64)>>;

fn line_chart(path: &Path, title: &str, x_desc: &str, y_desc: &str, series: &Series) -> Result<(), String> {
    let (x_max, y_max) = (x_end(series), y_top(series));
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| e.to_string())?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// The end of a line chart's x axis: 5% past its largest value, and past 1 (one GPU) at least.
fn x_end(series: &Series) -> f64 {
    series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)).fold(1.0f64, f64::max) * 1.05
}

/// The top of a line chart's y axis: 10% above the data, and 7% more for each row of the
/// legend (one per series), which sits in the upper left corner.
fn y_top(series: &Series) -> f64 {
    let data = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)).fold(0.0f64, f64::max);
    data.max(1e-9) * (1.1 + 0.07 * series.len() as f64)
}

fn config_label(stage: Option<zerobench_schema::ZeroStage>, offload: Option<zerobench_schema::Offload>) -> String {
    let mut s = stage.map_or("zero?".to_string(), |s| format!("zero{s}"));
    match offload {
        Some(zerobench_schema::Offload::None) => {}
        Some(o) => s.push_str(&format!("+{o}")),
        None => s.push_str("+offload?"),
    }
    s
}

/// A line's name in a chart's legend: its stage and offload, its micro-batch (`with_mbs`: the
/// memory charts are one per micro-batch), variant and build, and those of its precision,
/// sequence length, accumulation, source and device that are not the same for every line of the
/// chart (`chart`), so that no two lines share a name.
fn line_name(g: &ScalingGroup, chart: &Lines, with_mbs: bool) -> String {
    let mut s = config_label(g.stage, g.offload);
    if let Some(m) = g.micro_batch.filter(|_| with_mbs) {
        s.push_str(&format!(" mbs={m}"));
    }
    if !g.variant.is_empty() {
        s.push_str(&format!(" {}", g.variant));
    }
    if let Some(t) = g.threads {
        s.push_str(&format!(" threads={t}"));
    }
    s.push_str(&BuildNames::suffix(&g.build));
    let varies = |f: &dyn Fn(&ScalingGroup) -> String| chart.keys().any(|o| f(o) != f(g));
    let opt = |v: Option<u32>| v.map_or("?".to_string(), |v| v.to_string());
    let axes: [&dyn Fn(&ScalingGroup) -> String; 5] = [
        &|o| o.precision.map_or("precision=?".to_string(), |p| p.to_string()),
        &|o| format!("seq={}", opt(o.seq_len)),
        &|o| format!("grad_accum={}", opt(o.grad_accum)),
        &|o| format!("({})", o.source),
        &|o| format!("on {}", o.gpu.as_deref().unwrap_or("?")),
    ];
    for axis in axes {
        if varies(axis) {
            s.push_str(&format!(" {}", axis(g)));
        }
    }
    s
}

/// A chart's lines, named, each in order of GPUs (then nodes: the same GPU count on one node and
/// on two are two points).
fn series(lines: Lines, with_mbs: bool) -> Series {
    let names: Vec<String> = lines.keys().map(|g| line_name(g, &lines, with_mbs)).collect();
    names
        .into_iter()
        .zip(lines.into_values())
        .map(|(name, mut points)| {
            points.sort_by_key(|p| p.0);
            (name, points.into_iter().map(|((gpus, _), v)| (f64::from(gpus), v)).collect())
        })
        .collect()
}

/// The throughput plots' lines: by model, one per scaling group, samples/s against GPUs.
fn throughput_charts(tables: &Tables) -> BTreeMap<&str, Series> {
    let mut by_model: BTreeMap<&str, Lines> = BTreeMap::new();
    for r in &tables.scaling {
        by_model
            .entry(&r.group.model)
            .or_default()
            .entry(r.group.clone())
            .or_default()
            .push(((r.gpus, r.nodes), r.samples_per_s));
    }
    by_model.into_iter().map(|(model, lines)| (model, series(lines, true))).collect()
}

fn throughput(tables: &Tables, out: &Path, failed: &mut Vec<ReportError>) -> Vec<PathBuf> {
    let mut written = Vec::new();
    for (model, series) in throughput_charts(tables) {
        let path = out.join(format!("throughput-{}.svg", slug(model)));
        match line_chart(&path, &format!("{model}: throughput against GPUs"), "GPUs", "samples/s", &series) {
            Ok(()) => written.push(path),
            Err(e) => failed.push(err(&path)(e)),
        }
    }
    written
}

fn memory(tables: &Tables, out: &Path, failed: &mut Vec<ReportError>) -> Vec<PathBuf> {
    let mut written = Vec::new();
    for ((model, mbs), series) in memory_charts(tables) {
        let path = out.join(format!("memory-{}-mbs{mbs}.svg", slug(model)));
        let title = format!("{model}, micro-batch {mbs}: peak memory per GPU");
        match line_chart(&path, &title, "GPUs", "GiB", &series) {
            Ok(()) => written.push(path),
            Err(e) => failed.push(err(&path)(e)),
        }
    }
    written
}

/// The memory plots' lines: by model and micro-batch, then one per scaling group, each run's
/// peak memory per GPU in GiB against its GPUs, in order of GPUs.
fn memory_charts(tables: &Tables) -> BTreeMap<(&str, u32), Series> {
    let builds = BuildNames::of(&tables.runs);
    let mut charts: BTreeMap<(&str, u32), Lines> = BTreeMap::new();
    for r in tables.runs.iter().filter(|r| r.status == Status::Ok) {
        let (Some(m), Some(g), Some(bytes)) =
            (r.micro_batch, r.gpus, r.peak_allocated_bytes.or(r.peak_nvml_used_bytes).or(r.peak_rss_bytes))
        else {
            continue;
        };
        let point = ((g, r.nodes), bytes as f64 / (1u64 << 30) as f64);
        charts.entry((&r.model, m)).or_default().entry(ScalingGroup::of(r, &builds)).or_default().push(point);
    }
    charts.into_iter().map(|(key, lines)| (key, series(lines, false))).collect()
}

/// Runs drawn in the breakdown at most, so that the bars stay readable.
const MAX_BARS: usize = 40;

/// The bars of the step breakdown: per run with a step time, its label and its median step split
/// into disjoint parts ([`RunRow::breakdown`]), in the order of [`PARTS`]. Each bar adds up to the
/// run's median step.
pub fn breakdown_bars(runs: &[RunRow]) -> Vec<(String, [f64; 5])> {
    runs.iter()
        .filter_map(|r| {
            let parts = r.breakdown()?.parts();
            let label = format!(
                "{} {} mbs={} gpus={}",
                r.model,
                config_label(r.stage, r.offload),
                r.micro_batch.map_or("?".into(), |m| m.to_string()),
                r.gpus.map_or("?".into(), |g| g.to_string())
            );
            Some((label, parts))
        })
        .collect()
}

fn breakdown(runs: &[RunRow], out: &Path) -> Result<Option<PathBuf>, ReportError> {
    let bars = breakdown_bars(runs);
    if bars.is_empty() {
        return Ok(None);
    }
    let title = if bars.len() > MAX_BARS {
        format!("Median step time, by phase (the first {MAX_BARS} of {} runs)", bars.len())
    } else {
        "Median step time, by phase".to_string()
    };
    let path = out.join("step-breakdown.svg");
    draw_breakdown(&path, &title, &bars[..bars.len().min(MAX_BARS)]).map_err(err(&path))?;
    Ok(Some(path))
}

/// The parts of a breakdown bar, in stacking order.
pub const PARTS: [&str; 5] = ["forward", "backward", "exposed comm", "optimizer", "other"];

fn draw_breakdown(path: &Path, title: &str, bars: &[(String, [f64; 5])]) -> Result<(), String> {
    let x_max = bars.iter().map(|(_, p)| p.iter().sum::<f64>()).fold(1e-9, f64::max) * 1.15;
    let height = (120 + 28 * bars.len() as u32).max(300);
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(330)
        .build_cartesian_2d(0.0..x_max, (0..bars.len()).into_segmented())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len())
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc("ms")
        .draw()
        .map_err(|e| e.to_string())?;
    for (k, part) in PARTS.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let rects = bars.iter().enumerate().map(move |(i, (_, p))| {
            let x0: f64 = p[..k].iter().sum();
            let mut r =
                Rectangle::new([(x0, SegmentValue::Exact(i)), (x0 + p[k], SegmentValue::Exact(i + 1))], color.filled());
            r.set_margin(4, 4, 0, 0);
            r
        });
        chart
            .draw_series(rects)
            .map_err(|e| e.to_string())?
            .label(*part)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        // The bottom bars are the first runs in order, usually the smallest configurations.
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{RunReport, RunRow, Source, Status};

    /// A plot that cannot be written is reported and the others are still drawn: here every
    /// plot fails (its folder is missing), and `write` returns each failure instead of stopping.
    #[test]
    fn each_plot_fails_on_its_own() {
        let mut row = RunRow::new("r".into(), Source::Zerobench, "d".into(), "gpt2".into(), Status::Ok);
        row.step_ms_median = Some(10.0);
        row.forward_frac = Some(0.4);
        let runs = [RunReport { row, collectives: Vec::new(), memory_phases: Vec::new() }];
        let tables = Tables::build(&runs);
        let (written, failed) = write(&tables, Path::new("/nonexistent/zerobench/plots"));
        assert!(written.is_empty());
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(failed[0].to_string().contains("step-breakdown.svg"), "{}", failed[0]);
    }

    /// Each bar is its parts laid end to end: in the drawing, the segments of one bar are as
    /// wide as their parts (to the pixel) and each starts where the one before it ends.
    #[test]
    fn breakdown_bars_stack_their_parts() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("b.svg");
        let parts = [40.0, 50.0, 5.0, 10.0, 20.0];
        draw_breakdown(&path, "t", &[("r".to_string(), parts)]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let attr = |tag: &str, name: &str| -> f64 {
            let at = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            tag[at..].split('"').next().unwrap().parse().unwrap()
        };
        // The bar's segments: filled rectangles of one height, left to right.
        let rects: Vec<&str> = svg.split("<rect").skip(1).filter(|t| !t.contains("fill=\"#FFFFFF\"")).collect();
        let tallest = rects.iter().map(|t| attr(t, "height")).fold(0.0, f64::max);
        let mut bar: Vec<(f64, f64)> =
            rects.iter().filter(|t| attr(t, "height") == tallest).map(|t| (attr(t, "x"), attr(t, "width"))).collect();
        bar.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(bar.len(), parts.len(), "{svg}");
        let px_per_ms = bar.iter().map(|b| b.1).sum::<f64>() / parts.iter().sum::<f64>();
        for (k, (x, w)) in bar.iter().enumerate() {
            assert!((w - parts[k] * px_per_ms).abs() <= 1.5, "part {k}: {w} px for {} ms", parts[k]);
            if k > 0 {
                assert!((x - (bar[k - 1].0 + bar[k - 1].1)).abs() <= 1.5, "part {k} starts at {x}: {bar:?}");
            }
        }
    }

    /// Only runs with a positive, finite measurement and prediction are points of the log-log
    /// plot: two points here, from five rows.
    #[test]
    fn predicted_points_are_positive() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("p.svg");
        let row = |step_ms, predicted_step_ms| crate::predicted::PredictedRow {
            step_ms: Some(step_ms),
            predicted_step_ms: Some(predicted_step_ms),
            ..Default::default()
        };
        predicted_vs_measured(
            &path,
            &[row(10.0, 11.0), row(0.0, 5.0), row(5.0, f64::INFINITY), row(7.0, 0.0), row(20.0, 19.0)],
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().matches("<circle").count(), 2);
    }

    /// A plot's legend names a configuration by stage and offload; unknown parts say so.
    #[test]
    fn configuration_labels() {
        use zerobench_schema::{Offload, ZeroStage};
        assert_eq!(config_label(Some(ZeroStage::Z2), Some(Offload::None)), "zero2");
        assert_eq!(config_label(Some(ZeroStage::Z3), Some(Offload::OptimizerParams)), "zero3+optimizer+params");
        assert_eq!(config_label(None, None), "zero?+offload?");
    }

    #[test]
    fn long_labels_get_short_distinct_file_names() {
        let (a, b) = (slug(&"a".repeat(300)), slug(&format!("{}b", "a".repeat(299))));
        assert!(a.len() < 100 && b.len() < 100 && a != b, "{a} {b}");
        assert_eq!(slug("t5-large"), "t5-large");
        assert_eq!(slug("llama 3.2/8b (hf)"), "llama_3.2_8b__hf");
    }

    /// The predicted plot's axes hold every point with room on both sides, and each reference
    /// line is predicted = k × measured at both of its ends.
    #[test]
    fn predicted_axes_hold_every_point_and_lines_keep_their_slope() {
        // One point below 1 ms: from 20% below it to a factor of 2.5 above that.
        assert_eq!(log_range([0.3].into_iter()), (0.24, 0.6));
        for values in [vec![5.0, 8.0, 120.0, 90.0], vec![0.3], vec![2.0, 2.0]] {
            let (lo, hi) = log_range(values.iter().copied());
            let min = values.iter().copied().fold(f64::INFINITY, f64::min);
            let max = values.iter().copied().fold(0.0, f64::max);
            assert!(lo <= 0.8 * min.min(1.0) && hi >= 1.25 * max && hi >= 2.0 * lo, "{values:?}: {lo}..{hi}");
            for k in [0.9, 1.0, 1.1] {
                let [(x0, y0), (x1, y1)] = ratio_line(lo, hi, k);
                assert_eq!((x0, x1), (lo, hi));
                assert!((y0 / x0 - k).abs() < 1e-12 && (y1 / x1 - k).abs() < 1e-12, "k = {k}: {y0}, {y1}");
            }
        }
    }

    /// A line chart's y axis ends 10% above its highest point, and 7% higher per legend row.
    #[test]
    fn line_charts_leave_room_for_the_legend() {
        let series =
            |n: usize| -> Series { (0..n).map(|i| (format!("s{i}"), vec![(1.0, 50.0), (2.0, 100.0)])).collect() };
        for n in [1, 3] {
            let want = 100.0 * (1.1 + 0.07 * n as f64);
            assert!((y_top(&series(n)) - want).abs() < 1e-9, "{n} series: {}", y_top(&series(n)));
        }
    }

    /// The memory plot's points: peak GiB per GPU against GPUs, from the runs that finished ok,
    /// in order of GPUs.
    #[test]
    fn memory_points_are_gib_against_gpus() {
        use zerobench_schema::{Offload, ZeroStage};
        let report = |gpus: u32, gib: u64, status| {
            let mut row = RunRow::new(format!("g{gpus}"), Source::Zerobench, "d".into(), "gpt2".into(), status);
            (row.gpus, row.micro_batch, row.stage, row.offload) =
                (Some(gpus), Some(4), Some(ZeroStage::Z2), Some(Offload::None));
            row.peak_allocated_bytes = Some(gib << 30);
            RunReport { row, collectives: Vec::new(), memory_phases: Vec::new() }
        };
        let runs = [report(4, 3, Status::Ok), report(2, 6, Status::Ok), report(8, 1, Status::Failed)];
        let tables = Tables::build(&runs);
        let charts = memory_charts(&tables);
        assert_eq!(charts.len(), 1);
        assert_eq!(charts[&("gpt2", 4)], [("zero2".to_string(), vec![(2.0, 6.0), (4.0, 3.0)])]);
    }

    /// Runs of two sequence lengths (or any other axis of the scaling table's groups) are two
    /// lines of the throughput and memory plots, each in order of GPUs, named by what tells them
    /// apart; a second GPU kind in the chart names the device too.
    #[test]
    fn plots_draw_one_line_per_scaling_group() {
        use zerobench_schema::{Offload, ZeroStage};
        let report = |seq: u32, gpus: u32, gpu: &str| {
            let mut row =
                RunRow::new(format!("s{seq}g{gpus}{gpu}"), Source::Foreign, "d".into(), "gpt2".into(), Status::Ok);
            (row.gpus, row.micro_batch, row.stage, row.offload, row.seq_len) =
                (Some(gpus), Some(4), Some(ZeroStage::Z2), Some(Offload::None), Some(seq));
            row.gpu = Some(gpu.to_string());
            row.samples_per_s = Some(f64::from(10 * gpus + seq / 512));
            row.peak_allocated_bytes = Some(u64::from(gpus + seq / 512) << 30);
            RunReport { row, collectives: Vec::new(), memory_phases: Vec::new() }
        };
        let runs = [report(1024, 2, "H100"), report(512, 2, "H100"), report(1024, 1, "H100"), report(512, 1, "H100")];
        let tables = Tables::build(&runs);
        let line = |name: &str, points: [(f64, f64); 2]| (name.to_string(), points.to_vec());
        assert_eq!(
            throughput_charts(&tables)["gpt2"],
            [
                line("zero2 mbs=4 seq=512", [(1.0, 11.0), (2.0, 21.0)]),
                line("zero2 mbs=4 seq=1024", [(1.0, 12.0), (2.0, 22.0)])
            ]
        );
        assert_eq!(
            memory_charts(&tables)[&("gpt2", 4)],
            [line("zero2 seq=512", [(1.0, 2.0), (2.0, 3.0)]), line("zero2 seq=1024", [(1.0, 3.0), (2.0, 4.0)])]
        );
        let runs = [report(512, 2, "H100"), report(512, 1, "A100"), report(512, 1, "H100")];
        let names: Vec<String> = throughput_charts(&Tables::build(&runs))["gpt2"].iter().map(|l| l.0.clone()).collect();
        assert_eq!(names, ["zero2 mbs=4 on A100", "zero2 mbs=4 on H100"]);
    }

    /// The breakdown is 300 pixels high for a few bars and grows by 28 per bar past them.
    #[test]
    fn the_breakdown_grows_with_its_bars() {
        let d = tempfile::tempdir().unwrap();
        for (bars, height) in [(1, 300), (20, 680)] {
            let path = d.path().join(format!("b{bars}.svg"));
            let rows: Vec<(String, [f64; 5])> = (0..bars).map(|i| (format!("r{i}"), [1.0; 5])).collect();
            draw_breakdown(&path, "t", &rows).unwrap();
            let svg = std::fs::read_to_string(&path).unwrap();
            assert!(svg.contains(&format!("height=\"{height}\"")), "{bars} bars: {}", &svg[..200.min(svg.len())]);
            // Each bar is named on the axis.
            assert!((0..bars).all(|i| svg.contains(&format!(">\nr{i}\n</text>"))), "{svg}");
            // The legend: a 15 × 10 swatch per part.
            assert_eq!(svg.matches("width=\"15\" height=\"10\"").count(), PARTS.len(), "{svg}");
        }
    }

    /// Past 40 runs the breakdown draws the first 40 and says so in its title.
    #[test]
    fn a_long_breakdown_says_it_is_cut() {
        let d = tempfile::tempdir().unwrap();
        for (runs, cut) in [(40, false), (41, true)] {
            let rows: Vec<RunRow> = (0..runs)
                .map(|i| {
                    let mut r = RunRow::new(format!("r{i}"), Source::Zerobench, "d".into(), "gpt2".into(), Status::Ok);
                    (r.step_ms_median, r.forward_frac) = (Some(10.0), Some(0.5));
                    r
                })
                .collect();
            let out = d.path().join(runs.to_string());
            std::fs::create_dir_all(&out).unwrap();
            let path = breakdown(&rows, &out).unwrap().expect("a breakdown");
            let svg = std::fs::read_to_string(path).unwrap();
            assert_eq!(svg.contains(&format!("the first 40 of {runs} runs")), cut, "{runs} runs");
        }
    }

    /// A line chart's x axis ends 5% past its largest value, and past one GPU at least.
    #[test]
    fn line_charts_end_past_the_last_point() {
        let series = |xs: &[f64]| -> Series { vec![("s".into(), xs.iter().map(|x| (*x, 1.0)).collect())] };
        assert!((x_end(&series(&[1.0, 2.0, 8.0])) - 8.4).abs() < 1e-12);
        assert!((x_end(&series(&[0.5])) - 1.05).abs() < 1e-12);
    }

    /// The throughput plot names a series by stage, offload, micro-batch and, where runs have one,
    /// their variant.
    #[test]
    fn throughput_series_name_their_variant() {
        use zerobench_schema::{Offload, ZeroStage};
        let report = |gpus: u32, variant: &str| {
            let mut row =
                RunRow::new(format!("g{gpus}{variant}"), Source::Zerobench, "d".into(), "gpt2".into(), Status::Ok);
            (row.gpus, row.micro_batch, row.stage, row.offload) =
                (Some(gpus), Some(4), Some(ZeroStage::Z3), Some(Offload::None));
            (row.samples_per_s, row.variant) = (Some(10.0 * f64::from(gpus)), variant.to_string());
            RunReport { row, collectives: Vec::new(), memory_phases: Vec::new() }
        };
        let runs = [report(1, ""), report(2, ""), report(1, "hpz2"), report(2, "hpz2")];
        let d = tempfile::tempdir().unwrap();
        let mut failed = Vec::new();
        let written = throughput(&Tables::build(&runs), d.path(), &mut failed);
        assert!(failed.is_empty() && written.len() == 1, "{failed:?}");
        let svg = std::fs::read_to_string(&written[0]).unwrap();
        assert!(svg.contains(">\nzero3 mbs=4\n</text>") && svg.contains(">\nzero3 mbs=4 hpz2\n</text>"), "{svg}");
    }
}
