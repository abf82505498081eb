//! Fuzzing of the launcher's parsers: hostlist expressions, hostfiles in the three formats and
//! experiment specs. Inputs are grammar-aware (fragments of the real syntax, recombined), mutated
//! valid examples, and raw bytes; every input must give a value or an error, never a panic or an
//! unbounded expansion. The count comes from `ZEROBENCH_FUZZ_CASES` (default 20 000 per parser,
//! which CI runs; `docs/reliability.md` records the last campaign of 1 000 000).

use std::path::Path;

use zerobench_launcher::hostfile::{Hostfile, HostfileErrorKind, HostfileFormat};
use zerobench_launcher::hostlist;
use zerobench_launcher::spec::Spec;
use zerobench_schema::splitmix::SplitMix64;

/// A small deterministic generator (SplitMix64), so a failure names a reproducible case number.
struct Rng(SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

fn cases() -> usize {
    std::env::var("ZEROBENCH_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

/// Joins `parts` random fragments, then mutates a few bytes (insert, delete, replace).
fn build(rng: &mut Rng, fragments: &[&str], parts: usize) -> String {
    let mut s: Vec<u8> = (0..rng.below(parts) + 1).flat_map(|_| rng.pick(fragments).bytes()).collect();
    for _ in 0..rng.below(4) {
        let pos = if s.is_empty() { 0 } else { rng.below(s.len() + 1) };
        match rng.below(3) {
            0 => s.insert(pos, (rng.next() & 0xff) as u8),
            1 if pos < s.len() => {
                s.remove(pos);
            }
            _ if pos < s.len() => s[pos] = b"[]-,:=0123456789 \n\t#@x"[rng.below(22)],
            _ => {}
        }
    }
    String::from_utf8_lossy(&s).into_owned()
}

#[test]
fn hostlist_expand_and_compress_never_panic() {
    let frags = [
        "node",
        "n",
        "gpu-a",
        "rack",
        "[",
        "]",
        "-",
        ",",
        "0",
        "1",
        "01",
        "007",
        "9",
        "10",
        "99999999",
        "[1-3]",
        "[01-04,07]",
        "[3-1]",
        "[[",
        "]]",
        ".ex.com",
        " ",
        "x",
        "[0-1048577]",
        "[1-2][3-4]",
        "_",
        "\u{e9}",
    ];
    let mut rng = Rng(SplitMix64(1));
    for i in 0..cases() {
        let expr = build(&mut rng, &frags, 8);
        if let Ok(hosts) = hostlist::expand(&expr) {
            assert!(hosts.len() <= hostlist::MAX_HOSTS, "case {i}: {expr:?}");
            let _ = hostlist::compress(&hosts);
        }
    }
}

#[test]
fn hostfile_parsers_never_panic() {
    let frags = [
        "worker-0",
        "worker-1",
        "localhost",
        "10.0.0.1",
        " slots=",
        "slots=",
        "4",
        "0",
        "4x",
        "-1",
        "99999999999999999999",
        " max_slots=8",
        ":",
        ":2",
        "\n",
        "\r\n",
        "# comment\n",
        "\t",
        " ",
        "=",
        "\u{0}",
    ];
    let mut rng = Rng(SplitMix64(2));
    for i in 0..cases() {
        let text = build(&mut rng, &frags, 24);
        for format in [HostfileFormat::Deepspeed, HostfileFormat::Openmpi, HostfileFormat::Mpich] {
            let r = Hostfile::parse(&text, format, Path::new("fuzz.txt"));
            if let Err(e) = r {
                // Only an error about the whole file (it has no hosts) has no position.
                let at = if e.line == 0 {
                    assert!(matches!(e.kind, HostfileErrorKind::Empty), "case {i}: no position: {e}");
                    "fuzz.txt: ".to_string()
                } else {
                    assert!(e.column >= 1 && e.line <= text.lines().count().max(1), "case {i}: position: {e}");
                    format!("fuzz.txt:{}:{}: ", e.line, e.column)
                };
                assert!(e.to_string().starts_with(&at), "case {i}: an error names the file and position: {e}");
            }
        }
    }
}

#[test]
fn spec_loader_never_panics() {
    let valid =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../slurm/examples/gpu-cluster.yaml")).unwrap();
    let frags = [
        "cluster:\n",
        "  partition: gpu\n",
        "  gpus_per_node: 4\n",
        "  gpu_memory: 80GiB\n",
        "  time: \"01:00:00\"\n",
        "sweep:\n",
        "  models: [gpt2, gpt2-xl]\n",
        "  stages: [0, 1, 2, 3]\n",
        "  offload: optimizer\n",
        "  micro_batches: 4\n",
        "  nodes: [1, 2]\n",
        "worker:\n",
        "  steps: 20\n",
        "  lr: -1\n",
        "launch:\n",
        "  method: srun\n",
        "  method: pdsh\n",
        "  env: {A: \"$(x)\"}\n",
        "- ",
        ": ",
        "{",
        "}",
        "[",
        "]",
        "&a ",
        "*a ",
        "!!binary ",
        "\t",
        "'",
        "\"",
        "~\n",
        "1e999\n",
    ];
    let mut rng = Rng(SplitMix64(3));
    for i in 0..cases() {
        let text = if rng.below(4) == 0 {
            // A valid spec with a few bytes mutated.
            let mut b = valid.clone().into_bytes();
            for _ in 0..rng.below(6) + 1 {
                let p = rng.below(b.len());
                b[p] = b" :-[]{}\n0123456789abz\"'#&*!%"[rng.below(28)];
            }
            String::from_utf8_lossy(&b).into_owned()
        } else {
            build(&mut rng, &frags, 14)
        };
        if let Err(e) = Spec::parse(&text, Path::new("fuzz.yaml")) {
            let at = format!("fuzz.yaml:{}:{}: ", e.line, e.column);
            assert!(
                e.line >= 1 && e.column >= 1 && e.to_string().starts_with(&at),
                "case {i}: an error starts with file:line:column: {e}"
            );
        }
    }
}
