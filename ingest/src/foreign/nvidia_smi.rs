//! `nvidia-smi --query-gpu=... --format=csv[,nounits] [-l N]` logs: a header naming the queried
//! fields (`timestamp, index, name, memory.used [MiB], memory.total [MiB], power.draw [W],
//! utilization.gpu [%]`), then one row per GPU and sample. Values may carry their unit
//! (`1234 MiB`, `62.07 W`, `97 %`) or not (`nounits`); `[N/A]` is no value. The header may repeat
//! (one per `nvidia-smi` call). Fields ingest uses: `uuid`, `index` (or `pci.bus_id`), `name`,
//! `memory.used`, `memory.total`, `power.draw`, `timestamp` (`2024/03/20 16:22:18.301`).
//!
//! A GPU is its `uuid` where the log has one, else its file and `index` ([`GpuKey`]): the nodes
//! of a run each number their GPUs from 0, so the files of two nodes (`smi-node0.csv`,
//! `smi-node1.csv`) hold two GPUs 0, which must not be merged into one.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::text::quantity;

/// Which GPU a row is of.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum GpuKey {
    /// The GPU's `uuid`: the same GPU in every file, on every node.
    Uuid(String),
    /// Its `index` (or `pci.bus_id`, or `0` without either) in the file it was read from: unique
    /// within one node only.
    InFile { file: PathBuf, index: String },
}

/// Samples of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSamples {
    pub name: Option<String>,
    pub max_used_mib: Option<f64>,
    pub total_mib: Option<f64>,
    /// (seconds since 1970, watts)
    pub power: Vec<(Option<f64>, f64)>,
    /// (seconds since 1970, MiB used): kept so that a log shared by several runs can be split by
    /// their time spans ([`NvidiaSmi::within`]).
    pub used: Vec<(Option<f64>, f64)>,
}

/// Appends a sample; beyond [`MAX_SAMPLES`], one in two is dropped so memory stays bounded.
fn push_sample(v: &mut Vec<(Option<f64>, f64)>, sample: (Option<f64>, f64)) {
    if v.len() >= MAX_SAMPLES {
        let kept: Vec<_> = v.iter().step_by(2).copied().collect();
        *v = kept;
    }
    v.push(sample);
}

/// What the nvidia-smi rows of one run say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NvidiaSmi {
    pub lines: u64,
    /// The file being read: with the index, a GPU's key where the log has no `uuid`.
    pub file: PathBuf,
    columns: Option<Columns>,
    pub gpus: BTreeMap<GpuKey, GpuSamples>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Columns {
    n: usize,
    uuid: Option<usize>,
    index: Option<usize>,
    name: Option<usize>,
    used: Option<usize>,
    total: Option<usize>,
    power: Option<usize>,
    timestamp: Option<usize>,
}

/// Power samples kept per GPU; beyond this, one in two is dropped so memory stays bounded.
const MAX_SAMPLES: usize = 1 << 16;

impl NvidiaSmi {
    /// Reads one line; returns whether it was part of an nvidia-smi CSV log.
    pub fn line(&mut self, line: &str) -> bool {
        // A file saved with a byte order mark has it before the header's first field.
        let line = line.strip_prefix('\u{feff}').unwrap_or(line);
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        if let Some(c) = header(&cells) {
            self.columns = Some(c);
            self.lines += 1;
            return true;
        }
        let Some(cols) = &self.columns else { return false };
        // Another program's line in the same file (a training script's output in one Slurm
        // `.out`, a blank line) is no sample: it is skipped, and the header still holds for the
        // rows after it.
        if !cols.is_sample(&cells) {
            return false;
        }
        let key = match cols.uuid {
            Some(u) => GpuKey::Uuid(cells[u].to_string()),
            None => GpuKey::InFile {
                file: self.file.clone(),
                index: cols.index.map_or_else(|| "0".to_string(), |i| cells[i].to_string()),
            },
        };
        let g = self.gpus.entry(key).or_default();
        if let Some(i) = cols.name {
            g.name.get_or_insert_with(|| cells[i].to_string());
        }
        let t = cols.timestamp.and_then(|i| timestamp(cells[i]));
        if let Some(v) = cols.used.and_then(|i| number(cells[i])) {
            g.max_used_mib = Some(g.max_used_mib.map_or(v, |o| o.max(v)));
            push_sample(&mut g.used, (t, v));
        }
        if let Some(v) = cols.total.and_then(|i| number(cells[i])) {
            g.total_mib = Some(v);
        }
        if let Some(w) = cols.power.and_then(|i| number(cells[i])) {
            push_sample(&mut g.power, (t, w));
        }
        self.lines += 1;
        true
    }
}

impl Columns {
    /// Whether a line's cells are a sample row under this header: as many cells as it has
    /// fields, and a number (its unit after it, or none) or a bracketed `[N/A]`-like word in
    /// each column of memory or power.
    fn is_sample(&self, cells: &[&str]) -> bool {
        let numeric = |cell: &str| {
            cell.starts_with('[') || cell.split_whitespace().next().is_some_and(|t| t.parse::<f64>().is_ok())
        };
        cells.len() == self.n && [self.used, self.total, self.power].into_iter().flatten().all(|i| numeric(cells[i]))
    }
}

fn header(cells: &[&str]) -> Option<Columns> {
    if cells.len() < 2 || !cells.iter().any(|c| c.starts_with("memory.used")) {
        return None;
    }
    let field = |c: &str| c.split_once(" [").map_or(c, |(f, _)| f).to_string();
    if !cells.iter().all(|c| field(c).chars().all(|ch| ch.is_ascii_lowercase() || ch == '.' || ch == '_')) {
        return None;
    }
    let find = |name: &str| cells.iter().position(|c| field(c) == name);
    Some(Columns {
        n: cells.len(),
        uuid: find("uuid"),
        index: find("index").or_else(|| find("pci.bus_id")),
        name: find("name"),
        used: find("memory.used"),
        total: find("memory.total"),
        power: find("power.draw"),
        timestamp: find("timestamp"),
    })
}

/// `1234 MiB`, `62.07 W`, `97 %`, `1234` → the number; `[N/A]` → none.
fn number(cell: &str) -> Option<f64> {
    quantity(cell.split_whitespace().next()?)
}

/// `2024/03/20 16:22:18.301` → seconds since 1970 (UTC is assumed; only differences are used).
pub fn timestamp(cell: &str) -> Option<f64> {
    let (date, time) = cell.split_once(' ')?;
    let mut d = date.split(['/', '-']).map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, mi, s) = (quantity(t.next()?)?, quantity(t.next()?)?, quantity(t.next()?)?);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + mi * 60.0 + s)
}

impl NvidiaSmi {
    /// The first and last time stamp of a sample, when every sample has one.
    pub fn span(&self) -> Option<(f64, f64)> {
        let mut times = self.gpus.values().flat_map(|g| g.used.iter().chain(&g.power)).map(|(t, _)| *t);
        let first = times.next()??;
        times.try_fold((first, first), |(lo, hi), t| t.map(|t| (lo.min(t), hi.max(t))))
    }

    /// The samples taken from `from` to `to` (seconds since 1970, inclusive); `None` unless every
    /// sample has a time stamp.
    pub fn within(&self, from: f64, to: f64) -> Option<NvidiaSmi> {
        self.span()?;
        let keep = |v: &[(Option<f64>, f64)]| -> Vec<(Option<f64>, f64)> {
            v.iter().filter(|(t, _)| t.is_some_and(|t| t >= from && t <= to)).copied().collect()
        };
        let gpus = self
            .gpus
            .iter()
            .map(|(k, g)| {
                let used = keep(&g.used);
                let max_used_mib = used.iter().map(|(_, v)| *v).reduce(f64::max);
                let s = GpuSamples {
                    name: g.name.clone(),
                    max_used_mib,
                    total_mib: g.total_mib,
                    power: keep(&g.power),
                    used,
                };
                (k.clone(), s)
            })
            .filter(|(_, g)| !g.used.is_empty() || !g.power.is_empty())
            .collect();
        Some(NvidiaSmi { lines: self.lines, file: self.file.clone(), columns: None, gpus })
    }

    /// Adds another log's samples (two CSV files of one run): a GPU of both is one only by its
    /// `uuid` ([`GpuKey`]).
    pub fn merge(&mut self, o: &NvidiaSmi) {
        self.lines += o.lines;
        for (k, g) in &o.gpus {
            let mine = self.gpus.entry(k.clone()).or_default();
            if mine.name.is_none() {
                mine.name.clone_from(&g.name);
            }
            mine.max_used_mib = mine.max_used_mib.into_iter().chain(g.max_used_mib).reduce(f64::max);
            mine.total_mib = mine.total_mib.into_iter().chain(g.total_mib).reduce(f64::max);
            for s in &g.power {
                push_sample(&mut mine.power, *s);
            }
            for s in &g.used {
                push_sample(&mut mine.used, *s);
            }
        }
    }
}

impl GpuSamples {
    /// Mean power over the samples: time-weighted (trapezoids) when timestamps are there.
    pub fn mean_power_w(&self) -> Option<f64> {
        let mut timed: Vec<(f64, f64)> = self.power.iter().filter_map(|(t, w)| t.map(|t| (t, *w))).collect();
        // Samples of two files of one run may interleave.
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        if timed.len() >= 2 && timed.len() == self.power.len() {
            let mut energy = 0.0;
            for p in timed.windows(2) {
                let dt = p[1].0 - p[0].0;
                if dt > 0.0 {
                    energy += dt * (p[0].1 + p[1].1) / 2.0;
                }
            }
            let span = timed[timed.len() - 1].0 - timed[0].0;
            if span > 0.0 {
                return Some(energy / span);
            }
        }
        if self.power.is_empty() {
            return None;
        }
        Some(crate::stats::fsum(self.power.iter().map(|(_, w)| *w)) / self.power.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::foreign::text::checked;

    /// The key of GPU `i` of a log read without a file name (as these tests read lines).
    fn index(i: &str) -> GpuKey {
        GpuKey::InFile { file: PathBuf::new(), index: i.to_string() }
    }

    /// Two nodes' logs each number their GPUs 0-7: merged, they are 16 GPUs, each its node's;
    /// logs that name GPUs by `uuid` are merged by it (the same GPU in two files is one).
    #[test]
    fn gpus_of_two_files_are_told_apart_by_file_or_uuid() {
        let node = |file: &str, uuid: bool| {
            let mut smi = NvidiaSmi { file: PathBuf::from(file), ..NvidiaSmi::default() };
            let head = if uuid { "index, uuid, memory.used [MiB]" } else { "index, memory.used [MiB]" };
            assert!(smi.line(head));
            for i in 0..8 {
                let id = if uuid { format!(", GPU-{i}") } else { String::new() };
                assert!(smi.line(&format!("{i}{id}, 1000 MiB")));
            }
            smi
        };
        let mut both = node("node0.csv", false);
        both.merge(&node("node1.csv", false));
        assert_eq!(both.gpus.len(), 16);
        assert!(both.gpus.contains_key(&GpuKey::InFile { file: "node1.csv".into(), index: "7".into() }));
        let mut same = node("part0.csv", true);
        same.merge(&node("part1.csv", true));
        assert_eq!(same.gpus.len(), 8);
        assert!(same.gpus.contains_key(&GpuKey::Uuid("GPU-3".into())));
    }

    /// A header is a CSV line of at least two lower-case fields of which one is `memory.used`.
    #[test]
    fn headers() {
        assert!(header(&["index", "memory.used [MiB]"]).is_some());
        assert_eq!(header(&["memory.used [MiB]"]), None);
        assert_eq!(header(&["index", "name"]), None);
        assert_eq!(header(&["index", "Memory Used"]), None);
        // Fields with dots and underscores, as nvidia-smi names them; the bus id names the GPU.
        let c = header(&["pci.bus_id", "memory.used [MiB]", "power.draw [W]"]).expect("a header");
        assert_eq!((c.n, c.index, c.used, c.power), (3, Some(0), Some(1), Some(2)));
    }

    /// A run's share of a shared log: the samples within its span, and only the GPUs with one;
    /// a GPU with memory samples there and no power samples is kept.
    #[test]
    fn samples_within_a_span() {
        let gpu = |used: Vec<(Option<f64>, f64)>, power: Vec<(Option<f64>, f64)>| GpuSamples {
            used,
            power,
            ..Default::default()
        };
        let mut smi = NvidiaSmi::default();
        smi.gpus.insert(index("0"), gpu(vec![(Some(10.0), 1.0), (Some(20.0), 2.0)], vec![]));
        smi.gpus.insert(index("1"), gpu(vec![(Some(30.0), 3.0)], vec![(Some(30.0), 300.0)]));
        let part = smi.within(5.0, 15.0).unwrap();
        assert_eq!(part.gpus.keys().collect::<Vec<_>>(), [&index("0")]);
        assert_eq!(part.gpus[&index("0")].used, [(Some(10.0), 1.0)]);
        assert_eq!(smi.within(25.0, 35.0).unwrap().gpus.keys().collect::<Vec<_>>(), [&index("1")]);
        assert_eq!(smi.span(), Some((10.0, 30.0)));
        // A sample without a time stamp: no span, and no share can be cut.
        smi.gpus.get_mut(&index("1")).unwrap().power.push((None, 250.0));
        assert_eq!((smi.span(), smi.within(0.0, 100.0)), (None, None));
    }

    #[test]
    fn unix_time() {
        assert_eq!(timestamp("1970/01/01 00:00:01.5"), Some(1.5));
        assert_eq!(timestamp("2024/03/20 16:22:18.301").map(|t| t.round()), Some(1_710_951_738.0));
        assert_eq!(timestamp("yesterday"), None);
    }

    /// Every line of a log is counted, its header included; without time stamps, a GPU's power is
    /// the mean of its samples.
    #[test]
    fn lines_are_counted_and_untimed_power_is_the_mean() {
        let mut smi = NvidiaSmi::default();
        for line in ["index, memory.used [MiB], power.draw [W]", "0, 1000 MiB, 100.0 W", "0, 1200 MiB, 200.0 W"] {
            assert!(smi.line(line), "{line}");
        }
        assert_eq!(smi.lines, 3);
        assert_eq!(smi.gpus[&index("0")].mean_power_w(), Some(150.0));
        assert_eq!(smi.gpus[&index("0")].max_used_mib, Some(1200.0));
    }

    /// A line of another program between the rows (a training script writing to the same Slurm
    /// `.out`, a blank line, a line of as many commas but no figures) is no sample and leaves the
    /// header in force: the rows after it are read.
    #[test]
    fn a_stray_line_keeps_the_header() {
        let mut smi = NvidiaSmi::default();
        assert!(smi.line("timestamp, index, name, memory.used [MiB], power.draw [W]"));
        assert!(smi.line("2026/11/20 10:00:00.000, 0, NVIDIA H100 80GB HBM3, 20000 MiB, 300.00 W"));
        for stray in ["Epoch 0: loss=3.21", "", "Epoch 0, step 3, gpu 0, loss 3.21, lr 1e-4"] {
            assert!(!smi.line(stray), "{stray:?}");
        }
        assert!(smi.line("2026/11/20 10:00:01.000, 0, NVIDIA H100 80GB HBM3, 60000 MiB, 500.00 W"));
        assert!(smi.line("2026/11/20 10:00:02.000, 0, NVIDIA H100 80GB HBM3, [N/A], [N/A]"));
        assert_eq!(smi.lines, 4);
        let g = &smi.gpus[&index("0")];
        assert_eq!((smi.gpus.len(), g.used.len(), g.max_used_mib), (1, 2, Some(60000.0)));
    }

    /// A CSV saved with a UTF-8 byte order mark has it before the header: the header is read.
    #[test]
    fn a_byte_order_mark_before_the_header() {
        let mut smi = NvidiaSmi::default();
        assert!(smi.line("\u{feff}index, memory.used [MiB], power.draw [W]"));
        assert!(smi.line("0, 1000 MiB, 100.0 W"));
        assert_eq!(smi.gpus[&index("0")].max_used_mib, Some(1000.0));
    }

    /// `nan`, infinite, overflowing and negative figures measure nothing: no value, as `[N/A]`.
    #[test]
    fn impossible_figures_are_no_values() {
        for bad in ["nan", "NaN", "inf", "-inf", "1e400", "-5", "-0.5", "x", ""] {
            assert_eq!(quantity(bad), None, "{bad}");
        }
        assert_eq!((quantity(" 12.5 "), quantity("0"), quantity("1e3")), (Some(12.5), Some(0.0), Some(1000.0)));
        assert!(quantity("-0").is_some_and(|v| v.is_sign_positive()));
        assert_eq!((checked(f64::MAX * 2.0), checked(-1.0), checked(3.0)), (None, None, Some(3.0)));
        let mut smi = NvidiaSmi::default();
        assert!(smi.line("index, memory.used [MiB], memory.total [MiB], power.draw [W]"));
        assert!(smi.line("0, nan MiB, 1e400 MiB, -50.00 W"));
        assert!(smi.line("0, 1000 MiB, 81559 MiB, 300.00 W"));
        let g = &smi.gpus[&index("0")];
        assert_eq!((g.max_used_mib, g.total_mib, g.mean_power_w()), (Some(1000.0), Some(81559.0), Some(300.0)));
        assert_eq!(timestamp("2024/03/20 nan:22:18"), None);
    }

    /// Samples that all share one time stamp span no time: their mean power, not a division by
    /// zero.
    #[test]
    fn samples_of_one_instant_give_their_mean() {
        let g = GpuSamples { power: vec![(Some(5.0), 100.0), (Some(5.0), 300.0)], ..Default::default() };
        assert_eq!(g.mean_power_w(), Some(200.0));
    }

    /// Time weighting needs every sample's time: with one untimed, the mean of all is taken.
    #[test]
    fn one_untimed_sample_gives_the_plain_mean() {
        let g =
            GpuSamples { power: vec![(Some(0.0), 100.0), (Some(10.0), 100.0), (None, 400.0)], ..Default::default() };
        assert_eq!(g.mean_power_w(), Some(200.0));
    }
}
