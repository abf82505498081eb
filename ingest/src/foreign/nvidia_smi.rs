//! `nvidia-smi --query-gpu=... --format=csv[,nounits] [-l N]` logs: a header naming the queried
//! fields (`timestamp, index, name, memory.used [MiB], memory.total [MiB], power.draw [W],
//! utilization.gpu [%]`), then one row per GPU and sample. Values may carry their unit
//! (`1234 MiB`, `62.07 W`, `97 %`) or not (`nounits`); `[N/A]` is no value. The header may repeat
//! (one per `nvidia-smi` call). Fields ingest uses: `index` (or `pci.bus_id`), `name`,
//! `memory.used`, `memory.total`, `power.draw`, `timestamp` (`2024/03/20 16:22:18.301`).

use std::collections::BTreeMap;

/// Samples of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSamples {
    pub name: Option<String>,
    pub max_used_mib: Option<f64>,
    pub total_mib: Option<f64>,
    /// (seconds since an arbitrary origin, watts)
    pub power: Vec<(Option<f64>, f64)>,
}

/// What the nvidia-smi rows of one run say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NvidiaSmi {
    pub lines: u64,
    columns: Option<Columns>,
    pub gpus: BTreeMap<String, GpuSamples>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Columns {
    n: usize,
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
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        if let Some(c) = header(&cells) {
            self.columns = Some(c);
            self.lines += 1;
            return true;
        }
        let Some(cols) = &self.columns else { return false };
        if cells.len() != cols.n {
            self.columns = None;
            return false;
        }
        let key = cols.index.map_or_else(|| "0".to_string(), |i| cells[i].to_string());
        let g = self.gpus.entry(key).or_default();
        if let Some(i) = cols.name {
            g.name.get_or_insert_with(|| cells[i].to_string());
        }
        if let Some(v) = cols.used.and_then(|i| number(cells[i])) {
            g.max_used_mib = Some(g.max_used_mib.map_or(v, |o| o.max(v)));
        }
        if let Some(v) = cols.total.and_then(|i| number(cells[i])) {
            g.total_mib = Some(v);
        }
        if let Some(w) = cols.power.and_then(|i| number(cells[i])) {
            let t = cols.timestamp.and_then(|i| timestamp(cells[i]));
            if g.power.len() >= MAX_SAMPLES {
                let kept: Vec<_> = g.power.iter().step_by(2).copied().collect();
                g.power = kept;
            }
            g.power.push((t, w));
        }
        self.lines += 1;
        true
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
        index: find("index").or_else(|| find("pci.bus_id")).or_else(|| find("uuid")),
        name: find("name"),
        used: find("memory.used"),
        total: find("memory.total"),
        power: find("power.draw"),
        timestamp: find("timestamp"),
    })
}

/// `1234 MiB`, `62.07 W`, `97 %`, `1234` → the number; `[N/A]` → none.
fn number(cell: &str) -> Option<f64> {
    cell.split_whitespace().next()?.parse().ok().filter(|v: &f64| v.is_finite())
}

/// `2024/03/20 16:22:18.301` → seconds since 1970 (UTC is assumed; only differences are used).
fn timestamp(cell: &str) -> Option<f64> {
    let (date, time) = cell.split_once(' ')?;
    let mut d = date.split(['/', '-']).map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, mi, s) = (t.next()?.parse::<f64>().ok()?, t.next()?.parse::<f64>().ok()?, t.next()?.parse::<f64>().ok()?);
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

impl GpuSamples {
    /// Mean power over the samples: time-weighted (trapezoids) when timestamps are there.
    pub fn mean_power_w(&self) -> Option<f64> {
        let timed: Vec<(f64, f64)> = self.power.iter().filter_map(|(t, w)| t.map(|t| (t, *w))).collect();
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

    #[test]
    fn unix_time() {
        assert_eq!(timestamp("1970/01/01 00:00:01.5"), Some(1.5));
        assert_eq!(timestamp("2024/03/20 16:22:18.301").map(|t| t.round()), Some(1_710_951_738.0));
        assert_eq!(timestamp("yesterday"), None);
    }
}
