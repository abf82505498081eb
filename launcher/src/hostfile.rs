//! Hostfiles in the three formats launchers read, parsed strictly and rendered back.
//!
//! | format | line | read by |
//! |---|---|---|
//! | `deepspeed` | `host slots=N` | DeepSpeed's runner (pdsh and its MPI runners) |
//! | `openmpi` | `host slots=N [max_slots=M]` | Open MPI's `mpirun --hostfile` |
//! | `mpich` | `host` or `host:N` | MPICH/Hydra `mpiexec -f` (and Intel MPI) |
//!
//! `#` starts a comment (whole line, or after whitespace); blank lines are skipped.
//!
//! The parser is stricter than the launchers on purpose. DeepSpeed's regex
//! `^(\S+)\s+slots=(\d+)` accepts `slots=0`, `slots=4x` (as 4) and any trailing text; Open MPI
//! adds up a host listed twice. Each of these is an error here naming the line and column, as are
//! duplicate hosts (the node order is the rank order, so a host twice is ambiguous), an empty file,
//! and the other format's syntax (`host:4` in a DeepSpeed file). Every format requires an explicit
//! slot count except MPICH's bare `host`, which Hydra defines as one slot.

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The most slots a host may declare; far above any node, low enough to catch typos.
pub const MAX_SLOTS: u32 = 4096;

/// `:line:column`, or nothing for errors about a whole file (line 0).
pub(crate) fn at(line: usize, column: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(":{line}:{column}")
    }
}

/// Which launcher's syntax a hostfile is in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostfileFormat {
    #[default]
    Deepspeed,
    Openmpi,
    Mpich,
}

impl HostfileFormat {
    pub const ALL: [HostfileFormat; 3] = [HostfileFormat::Deepspeed, HostfileFormat::Openmpi, HostfileFormat::Mpich];

    pub fn as_str(self) -> &'static str {
        match self {
            HostfileFormat::Deepspeed => "deepspeed",
            HostfileFormat::Openmpi => "openmpi",
            HostfileFormat::Mpich => "mpich",
        }
    }

    /// The file name a run folder uses for this format: `hostfile.` and the format's name.
    pub fn file_name(self) -> String {
        format!("hostfile.{}", self.as_str())
    }
}

impl fmt::Display for HostfileFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HostfileFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|f| f.as_str() == s).ok_or_else(|| {
            let (last, rest) = Self::ALL.split_last().expect("three formats");
            let rest: Vec<&str> = rest.iter().map(|f| f.as_str()).collect();
            format!("unknown hostfile format '{s}' (expected {} or {last})", rest.join(", "))
        })
    }
}

/// One host and how many ranks it takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostEntry {
    pub host: String,
    pub slots: u32,
    /// Open MPI's oversubscription cap (DeepSpeed ignores it; MPICH has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_slots: Option<u32>,
}

/// A parsed hostfile: hosts in file order (which is node-rank order), each at most once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hostfile {
    pub hosts: Vec<HostEntry>,
}

/// A hostfile that cannot be used, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {kind}", file.display(), at(*line, *column))]
pub struct HostfileError {
    pub file: PathBuf,
    /// 1-based; 0 for errors about the whole file.
    pub line: usize,
    /// 1-based.
    pub column: usize,
    pub kind: HostfileErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostfileErrorKind {
    #[error("no hosts (only comments or blank lines)")]
    Empty,
    #[error("host '{host}' is listed again (first on line {first_line}); list each host once")]
    Duplicate { host: String, first_line: usize },
    #[error("'{host}' has no slot count; write '{host} slots=N'")]
    MissingSlots { host: String },
    #[error("'{0}' is MPICH syntax; in a {1} hostfile write 'host slots=N'")]
    ColonSyntax(String, HostfileFormat),
    #[error("'{0}' is DeepSpeed/Open MPI syntax; in an MPICH hostfile write 'host:N'")]
    SlotsSyntax(String),
    #[error("slots must be a whole number from 1 to {MAX_SLOTS}, not '{0}'")]
    BadSlots(String),
    #[error("max_slots must be a whole number from 1 to {MAX_SLOTS}, not '{0}'")]
    BadMaxSlots(String),
    #[error("max_slots={max} is below slots={slots}")]
    MaxBelowSlots { slots: u32, max: u32 },
    #[error("max_slots is Open MPI syntax; DeepSpeed ignores it, so a deepspeed hostfile may not use it")]
    MaxSlotsNotDeepspeed,
    #[error("unexpected '{0}' (a line is 'host slots=N' with nothing after it but a comment)")]
    Trailing(String),
    #[error("'{0}' is not a host name")]
    BadHost(String),
    #[error("cannot read: {0}")]
    Io(String),
}

impl Hostfile {
    /// Reads and parses a hostfile.
    pub fn read(path: &Path, format: HostfileFormat) -> Result<Self, HostfileError> {
        let text = std::fs::read_to_string(path).map_err(|e| HostfileError {
            file: path.to_path_buf(),
            line: 0,
            column: 0,
            kind: HostfileErrorKind::Io(e.to_string()),
        })?;
        Self::parse(&text, format, path)
    }

    /// Parses hostfile text; `file` is only used in errors.
    pub fn parse(text: &str, format: HostfileFormat, file: &Path) -> Result<Self, HostfileError> {
        let mut hosts: Vec<HostEntry> = Vec::new();
        let mut first_line: Vec<usize> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let err = |column: usize, kind| HostfileError { file: file.to_path_buf(), line: line_no, column, kind };
            let Some(entry) = parse_line(raw, format).map_err(|(c, k)| err(c, k))? else { continue };
            if let Some(j) = hosts.iter().position(|h| h.host == entry.host) {
                let col = raw.find(entry.host.as_str()).unwrap_or(0) + 1;
                return Err(err(col, HostfileErrorKind::Duplicate { host: entry.host, first_line: first_line[j] }));
            }
            hosts.push(entry);
            first_line.push(line_no);
        }
        if hosts.is_empty() {
            return Err(HostfileError { file: file.to_path_buf(), line: 0, column: 0, kind: HostfileErrorKind::Empty });
        }
        Ok(Hostfile { hosts })
    }

    /// The hostfile in a format, one host per line. `parse(render(x)) == x` for every format that
    /// can express `x` (MPICH has no `max_slots`, which it drops).
    pub fn render(&self, format: HostfileFormat) -> String {
        let mut s = String::new();
        for h in &self.hosts {
            let _ = match format {
                HostfileFormat::Deepspeed => writeln!(s, "{} slots={}", h.host, h.slots),
                HostfileFormat::Openmpi => match h.max_slots {
                    Some(m) => writeln!(s, "{} slots={} max_slots={}", h.host, h.slots, m),
                    None => writeln!(s, "{} slots={}", h.host, h.slots),
                },
                HostfileFormat::Mpich => writeln!(s, "{}:{}", h.host, h.slots),
            };
        }
        s
    }
}

/// A host name as the launchers take it: a name, an ssh alias or an IP address. Characters that
/// a shell, pdsh's `-w` or a hostlist would read specially are refused.
pub fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !host.starts_with('-')
}

/// Parses one line: `Ok(None)` for blank and comment lines; errors carry a 1-based column.
fn parse_line(raw: &str, format: HostfileFormat) -> Result<Option<HostEntry>, (usize, HostfileErrorKind)> {
    // A '#' starts a comment at the start of the line or after whitespace.
    let content =
        match raw.char_indices().find(|&(i, c)| c == '#' && (i == 0 || raw[..i].ends_with(char::is_whitespace))) {
            Some((i, _)) => &raw[..i],
            None => raw,
        };
    let mut tokens = tokens(content);
    let Some((host_col, host_tok)) = tokens.next() else { return Ok(None) };
    let entry = if format == HostfileFormat::Mpich {
        if host_tok.contains('=') {
            return Err((host_col, HostfileErrorKind::SlotsSyntax(host_tok.to_string())));
        }
        let (host, slots) = match host_tok.split_once(':') {
            Some((h, n)) => {
                (h, parse_count(n).map_err(|_| (host_col + h.len() + 1, HostfileErrorKind::BadSlots(n.into())))?)
            }
            None => (host_tok, 1),
        };
        if let Some((c, t)) = tokens.next() {
            let kind = if t.starts_with("slots=") {
                HostfileErrorKind::SlotsSyntax(t.to_string())
            } else {
                HostfileErrorKind::Trailing(t.to_string())
            };
            return Err((c, kind));
        }
        HostEntry { host: host.to_string(), slots, max_slots: None }
    } else {
        if host_tok.contains(':') {
            return Err((host_col, HostfileErrorKind::ColonSyntax(host_tok.to_string(), format)));
        }
        let mut slots = None;
        let mut max_slots = None;
        for (c, t) in tokens {
            if let Some(n) = t.strip_prefix("slots=") {
                if slots.is_some() {
                    return Err((c, HostfileErrorKind::Trailing(t.to_string())));
                }
                slots = Some(parse_count(n).map_err(|_| (c + 6, HostfileErrorKind::BadSlots(n.into())))?);
            } else if let Some(n) = t.strip_prefix("max_slots=") {
                if format == HostfileFormat::Deepspeed {
                    return Err((c, HostfileErrorKind::MaxSlotsNotDeepspeed));
                }
                if max_slots.is_some() {
                    return Err((c, HostfileErrorKind::Trailing(t.to_string())));
                }
                max_slots = Some(parse_count(n).map_err(|_| (c + 10, HostfileErrorKind::BadMaxSlots(n.into())))?);
            } else {
                return Err((c, HostfileErrorKind::Trailing(t.to_string())));
            }
        }
        let Some(slots) = slots else {
            return Err((host_col, HostfileErrorKind::MissingSlots { host: host_tok.to_string() }));
        };
        if let Some(max) = max_slots.filter(|&m| m < slots) {
            return Err((host_col, HostfileErrorKind::MaxBelowSlots { slots, max }));
        }
        HostEntry { host: host_tok.to_string(), slots, max_slots }
    };
    if !valid_host(&entry.host) {
        return Err((host_col, HostfileErrorKind::BadHost(entry.host)));
    }
    Ok(Some(entry))
}

/// Space- or tab-separated tokens with their 1-based columns (in characters).
fn tokens(s: &str) -> impl Iterator<Item = (usize, &str)> {
    // ASCII separators only: every separator is one byte, so the offsets below stay on char
    // boundaries; other Unicode spaces end up inside a token and fail the host-name check.
    s.split([' ', '\t', '\r'])
        .scan(0usize, |pos, tok| {
            let start = *pos;
            *pos += tok.len() + 1;
            Some((start, tok))
        })
        .filter(|(_, t)| !t.is_empty())
        .map(move |(start, t)| (s[..start].chars().count() + 1, t))
}

/// A slot count: digits only (no sign, no suffix), 1..=MAX_SLOTS.
fn parse_count(s: &str) -> Result<u32, ()> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(());
    }
    s.parse::<u32>().ok().filter(|n| (1..=MAX_SLOTS).contains(n)).ok_or(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Each format's name is its serde name and its run-folder file's suffix, and parses back;
    /// any other name is refused with the three that exist.
    #[test]
    fn format_names_parse_back_and_name_their_files() {
        let names: Vec<String> = HostfileFormat::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["deepspeed", "openmpi", "mpich"]);
        for f in HostfileFormat::ALL {
            assert_eq!(f.as_str().parse::<HostfileFormat>(), Ok(f));
            assert_eq!(serde_json::to_string(&f).unwrap(), format!("\"{}\"", f.as_str()));
        }
        let files: Vec<String> = HostfileFormat::ALL.iter().map(|f| f.file_name()).collect();
        assert_eq!(files, ["hostfile.deepspeed", "hostfile.openmpi", "hostfile.mpich"]);
        let e = "slurm".parse::<HostfileFormat>().unwrap_err();
        assert_eq!(e, "unknown hostfile format 'slurm' (expected deepspeed, openmpi or mpich)");
    }

    fn parse(text: &str, f: HostfileFormat) -> Result<Hostfile, HostfileError> {
        Hostfile::parse(text, f, Path::new("hf"))
    }

    fn kind(text: &str, f: HostfileFormat) -> (usize, usize, HostfileErrorKind) {
        let e = parse(text, f).expect_err(text);
        (e.line, e.column, e.kind)
    }

    #[test]
    fn accepts_the_documented_forms() {
        let ds = parse(
            "# c\n\n   worker-0 slots=2\nworker-1\tslots=4 # gpus\n10.0.0.3 slots=1\n",
            HostfileFormat::Deepspeed,
        )
        .unwrap();
        assert_eq!(
            ds.hosts.iter().map(|h| (h.host.as_str(), h.slots)).collect::<Vec<_>>(),
            [("worker-0", 2), ("worker-1", 4), ("10.0.0.3", 1)]
        );
        let om = parse("a slots=2 max_slots=8\nb slots=1\n", HostfileFormat::Openmpi).unwrap();
        assert_eq!(om.hosts[0].max_slots, Some(8));
        let mp = parse("a:2\nb\n", HostfileFormat::Mpich).unwrap();
        assert_eq!(mp.hosts.iter().map(|h| h.slots).collect::<Vec<_>>(), [2, 1]);
    }

    #[test]
    fn rejects_what_deepspeed_silently_accepts() {
        use HostfileErrorKind as K;
        let d = HostfileFormat::Deepspeed;
        assert_eq!(kind("a slots=0\n", d), (1, 9, K::BadSlots("0".into())));
        assert_eq!(kind("a slots=4\nb slots=4x\n", d), (2, 9, K::BadSlots("4x".into())));
        assert_eq!(kind("a slots=1\nb slots=1\na slots=2\n", d).2, K::Duplicate { host: "a".into(), first_line: 1 });
        assert_eq!(kind("# only\n\n", d), (0, 0, K::Empty));
        assert_eq!(kind("", d).2, K::Empty);
        assert_eq!(kind("a:4\n", d), (1, 1, K::ColonSyntax("a:4".into(), d)));
        assert_eq!(kind("a\n", d).2, K::MissingSlots { host: "a".into() });
        assert_eq!(kind("a slots = 4\n", d).2, K::Trailing("slots".into()));
        assert_eq!(kind("a SLOTS=4\n", d).2, K::Trailing("SLOTS=4".into()));
        assert_eq!(kind("a slots=2 max_slots=8\n", d).2, K::MaxSlotsNotDeepspeed);
        assert_eq!(kind("a slots=2 extra\n", d).2, K::Trailing("extra".into()));
        assert_eq!(kind("a slots=-1\n", d).2, K::BadSlots("-1".into()));
        // A sign is not a digit, though Rust's parser would take it; the column is the value's.
        assert_eq!(kind("a slots=+4\n", d), (1, 9, K::BadSlots("+4".into())));
        assert_eq!(kind("a slots=2 max_slots=x\n", HostfileFormat::Openmpi), (1, 21, K::BadMaxSlots("x".into())));
        assert_eq!(kind("a slots=99999999999\n", d).2, K::BadSlots("99999999999".into()));
        assert_eq!(kind("a;rm slots=1\n", d).2, K::BadHost("a;rm".into()));
        assert_eq!(kind("a slots=2 max_slots=1\n", HostfileFormat::Openmpi).2, K::MaxBelowSlots { slots: 2, max: 1 });
        assert_eq!(kind("a slots=2\n", HostfileFormat::Mpich).2, K::SlotsSyntax("slots=2".into()));
        assert_eq!(kind("a:0\n", HostfileFormat::Mpich), (1, 3, K::BadSlots("0".into())));
        assert_eq!(kind("a:\n", HostfileFormat::Mpich).2, K::BadSlots(String::new()));
        let e = parse("x\n", d).unwrap_err();
        assert_eq!(e.to_string(), "hf:1:1: 'x' has no slot count; write 'x slots=N'");
    }

    fn hostfile() -> impl Strategy<Value = Hostfile> {
        proptest::collection::btree_map(
            "[a-z][a-z0-9-]{0,6}(\\.[a-z]{1,3})?",
            (1u32..=64, proptest::option::of(0u32..8)),
            1..12,
        )
        .prop_map(|m| Hostfile {
            hosts: m
                .into_iter()
                .map(|(host, (slots, extra))| HostEntry { host, slots, max_slots: extra.map(|e| slots + e) })
                .collect(),
        })
    }

    proptest! {
        #[test]
        fn parse_inverts_render(hf in hostfile()) {
            let om = parse(&hf.render(HostfileFormat::Openmpi), HostfileFormat::Openmpi).unwrap();
            prop_assert_eq!(&om, &hf);
            let mut plain = hf.clone();
            plain.hosts.iter_mut().for_each(|h| h.max_slots = None);
            for f in [HostfileFormat::Deepspeed, HostfileFormat::Mpich] {
                prop_assert_eq!(&parse(&hf.render(f), f).unwrap(), &plain);
            }
        }

        #[test]
        fn arbitrary_text_never_panics(s in "[a-z0-9:=# \\n\\t-]{0,64}") {
            for f in HostfileFormat::ALL {
                let _ = parse(&s, f);
            }
        }
    }
}
