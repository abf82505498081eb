//! Slurm hostlist expressions: `node[01-04,07],gpu-a[1-2]` to host names and back.
//!
//! The grammar is Slurm's (slurm.conf(5) "NodeName", checked against `scontrol show hostnames`
//! 22.05, see `docs/launcher.md`):
//!
//! * A list is separated by commas or whitespace; commas inside brackets belong to the bracket.
//! * A bracket holds comma-separated numbers and `lo-hi` ranges. The low bound's digits set the
//!   width: `n[01-03]` is `n01 n02 n03`, `n[1-010]` is `n1 … n10`, `n[01,3,005]` keeps each width.
//! * Several brackets make a cartesian product, the leftmost varying slowest, but the name must end
//!   with a bracket: `rack[1-2]-n[01-02]` is valid, `n[1-2]-ib` is not.
//! * Duplicates are kept, in order.
//!
//! Errors are raised for everything Slurm rejects, and also for an unclosed bracket, which
//! `scontrol` turns into garbage (`n[1-3` prints `n]`) instead of refusing.
//!
//! [`compress`] is the inverse of [`expand`] for any list of names: `expand(compress(x)) == x`.

use std::fmt::Write as _;

/// The most names one expression may expand to, so that `n[0-99999999999]` is an error and not an
/// attempt to allocate the universe.
pub const MAX_HOSTS: usize = 1 << 20;

/// Why an expression is not a hostlist, and where (a 0-based byte offset into the expression).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid hostlist '{expr}' at offset {offset}: {kind}")]
pub struct HostlistError {
    pub expr: String,
    pub offset: usize,
    pub kind: HostlistErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostlistErrorKind {
    #[error("'[' is never closed")]
    Unclosed,
    #[error("']' without a matching '['")]
    UnmatchedClose,
    #[error("brackets cannot be nested")]
    Nested,
    #[error("a bracket must end the host name (Slurm rejects text after the last ']')")]
    TextAfterBracket,
    #[error("empty bracket or empty element in a bracket")]
    EmptyRange,
    #[error("'{0}' is not a number or a range lo-hi of numbers")]
    NotNumeric(String),
    #[error("range {lo}-{hi} goes down")]
    Descending { lo: u64, hi: u64 },
    #[error("number '{0}' is too large")]
    Overflow(String),
    #[error("expands to more than {MAX_HOSTS} host names")]
    TooMany,
}

/// Expands a hostlist expression to host names, in order, duplicates kept.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    let err = |offset: usize, kind| HostlistError { expr: expr.to_string(), offset, kind };
    let mut out = Vec::new();
    for (start, item) in split_items(expr).map_err(|(o, k)| err(o, k))? {
        expand_item(item, &mut out).map_err(|(o, k)| err(start + o, k))?;
    }
    Ok(out)
}

/// Splits at commas and whitespace outside brackets, returning each item with its offset.
fn split_items(expr: &str) -> Result<Vec<(usize, &str)>, (usize, HostlistErrorKind)> {
    let mut items = Vec::new();
    let mut depth_open: Option<usize> = None;
    let mut start = 0;
    for (i, c) in expr.char_indices() {
        match c {
            '[' if depth_open.is_some() => return Err((i, HostlistErrorKind::Nested)),
            '[' => depth_open = Some(i),
            ']' if depth_open.is_none() => return Err((i, HostlistErrorKind::UnmatchedClose)),
            ']' => depth_open = None,
            ',' | ' ' | '\t' | '\n' | '\r' if depth_open.is_none() => {
                if i > start {
                    items.push((start, &expr[start..i]));
                }
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if let Some(open) = depth_open {
        return Err((open, HostlistErrorKind::Unclosed));
    }
    if expr.len() > start {
        items.push((start, &expr[start..]));
    }
    Ok(items)
}

/// One number of a bracket with the width its digits were written with.
#[derive(Debug, Clone, Copy)]
struct Num {
    value: u64,
    width: usize,
}

/// A bracket element: `lo` or `lo-hi`, printed with `lo`'s width.
#[derive(Debug, Clone, Copy)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    fn len(&self) -> u64 {
        self.hi - self.lo + 1
    }
}

fn expand_item(item: &str, out: &mut Vec<String>) -> Result<(), (usize, HostlistErrorKind)> {
    // Segments: literal text and bracket groups, in order.
    let mut literals: Vec<&str> = Vec::new();
    let mut groups: Vec<Vec<Range>> = Vec::new();
    let mut rest = item;
    let mut offset = 0;
    while let Some(open) = rest.find('[') {
        // split_items guarantees a matching ']' with no '[' in between.
        let close = open + rest[open..].find(']').ok_or((offset + open, HostlistErrorKind::Unclosed))?;
        literals.push(&rest[..open]);
        groups.push(parse_bracket(&rest[open + 1..close]).map_err(|(o, k)| (offset + open + 1 + o, k))?);
        offset += close + 1;
        rest = &rest[close + 1..];
    }
    if !groups.is_empty() && !rest.is_empty() {
        return Err((offset, HostlistErrorKind::TextAfterBracket));
    }
    if groups.is_empty() {
        push_checked(out, rest.to_string())?;
        return Ok(());
    }
    let total = names_in(&groups)
        .filter(|&n| n <= (MAX_HOSTS - out.len().min(MAX_HOSTS)) as u64)
        .ok_or((0, HostlistErrorKind::TooMany))?;
    out.reserve(total as usize);
    let mut name = String::new();
    cartesian(&literals, &groups, 0, &mut name, out)
}

/// How many names the bracket groups of one item expand to (`None` past `u64`): an item past
/// the limit is refused from this count before any name is made.
fn names_in(groups: &[Vec<Range>]) -> Option<u64> {
    groups.iter().try_fold(1u64, |acc, g| acc.checked_mul(g.iter().map(Range::len).sum::<u64>()))
}

fn push_checked(out: &mut Vec<String>, name: String) -> Result<(), (usize, HostlistErrorKind)> {
    if out.len() >= MAX_HOSTS {
        return Err((0, HostlistErrorKind::TooMany));
    }
    out.push(name);
    Ok(())
}

/// Appends every combination of the groups from `level` on, the leftmost varying slowest. The
/// count checked before is checked again name by name: the limit holds even if that count were
/// wrong, and an expansion past it stops at the limit rather than running out of memory.
fn cartesian(
    literals: &[&str],
    groups: &[Vec<Range>],
    level: usize,
    name: &mut String,
    out: &mut Vec<String>,
) -> Result<(), (usize, HostlistErrorKind)> {
    if level == groups.len() {
        return push_checked(out, name.clone());
    }
    let keep = name.len();
    for r in &groups[level] {
        for v in r.lo..=r.hi {
            name.truncate(keep);
            name.push_str(literals[level]);
            let _ = write!(name, "{v:0width$}", width = r.width);
            cartesian(literals, groups, level + 1, name, out)?;
        }
    }
    name.truncate(keep);
    Ok(())
}

fn parse_bracket(body: &str) -> Result<Vec<Range>, (usize, HostlistErrorKind)> {
    let mut ranges = Vec::new();
    let mut at = 0;
    for part in body.split(',') {
        if part.is_empty() {
            return Err((at, HostlistErrorKind::EmptyRange));
        }
        let range = match part.split_once('-') {
            None => {
                let n = parse_num(part).map_err(|k| (at, k))?;
                Range { lo: n.value, hi: n.value, width: n.width }
            }
            Some((lo, hi)) => {
                let lo_n = parse_num(lo).map_err(|k| (at, k))?;
                let hi_n = parse_num(hi).map_err(|k| (at + lo.len() + 1, k))?;
                if hi_n.value < lo_n.value {
                    return Err((at, HostlistErrorKind::Descending { lo: lo_n.value, hi: hi_n.value }));
                }
                Range { lo: lo_n.value, hi: hi_n.value, width: lo_n.width }
            }
        };
        ranges.push(range);
        at += part.len() + 1;
    }
    Ok(ranges)
}

fn parse_num(s: &str) -> Result<Num, HostlistErrorKind> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HostlistErrorKind::NotNumeric(s.to_string()));
    }
    let value = s.parse::<u64>().map_err(|_| HostlistErrorKind::Overflow(s.to_string()))?;
    // Slurm's own limit on widths is far below this; it keeps `format!` padding sane.
    if s.len() > 18 {
        return Err(HostlistErrorKind::Overflow(s.to_string()));
    }
    Ok(Num { value, width: s.len() })
}

/// A host name split into a text prefix and a trailing number as written.
struct Split<'a> {
    prefix: &'a str,
    num: Option<Num>,
}

fn split_suffix(host: &str) -> Split<'_> {
    let digits = host.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (prefix, tail) = host.split_at(host.len() - digits);
    // Very long digit runs do not fit u64 or Slurm's widths: keep them literal.
    match (digits, tail.parse::<u64>()) {
        (1..=18, Ok(value)) => Split { prefix, num: Some(Num { value, width: digits }) },
        _ => Split { prefix: host, num: None },
    }
}

/// Compresses host names into a hostlist expression, keeping their order and duplicates:
/// `n01,n02,n03,n05,gpu-a1,gpu-a2` becomes `n[01-03,05],gpu-a[1-2]` (what `scontrol show
/// hostlist` prints). Names that [`expand`] would misread (containing `[`, `]`, `,` or
/// whitespace) cannot be written as a hostlist and are an error.
pub fn compress<S: AsRef<str>>(hosts: &[S]) -> Result<String, HostlistError> {
    // Runs of consecutive numbers with the same prefix, in input order.
    struct Run<'a> {
        prefix: &'a str,
        range: Option<Range>,
    }
    let mut runs: Vec<Run<'_>> = Vec::new();
    for h in hosts {
        let h = h.as_ref();
        if let Some(offset) = h.find(|c: char| matches!(c, '[' | ']' | ',') || c.is_whitespace()) {
            return Err(HostlistError {
                expr: h.to_string(),
                offset,
                kind: HostlistErrorKind::NotNumeric("a host name with brackets, commas or spaces".into()),
            });
        }
        if h.is_empty() {
            return Err(HostlistError { expr: String::new(), offset: 0, kind: HostlistErrorKind::EmptyRange });
        }
        let s = split_suffix(h);
        if let (Some(n), Some(last)) = (s.num, runs.last_mut()) {
            if let Some(r) = last.range.as_mut() {
                // Extends the run when printing the next number with the run's width gives back
                // exactly this name (so n9,n10 joins as n[9-10] but n9,n010 does not).
                if last.prefix == s.prefix
                    && r.hi.checked_add(1) == Some(n.value)
                    && format!("{:0w$}", n.value, w = r.width).len() == n.width
                {
                    r.hi = n.value;
                    continue;
                }
            }
        }
        runs.push(Run { prefix: s.prefix, range: s.num.map(|n| Range { lo: n.value, hi: n.value, width: n.width }) });
    }
    // Neighbouring numbered runs with the same prefix share one bracket.
    let mut out = String::new();
    let mut i = 0;
    while i < runs.len() {
        if !out.is_empty() {
            out.push(',');
        }
        let run = &runs[i];
        let Some(first) = run.range else {
            out.push_str(run.prefix);
            i += 1;
            continue;
        };
        let mut j = i + 1;
        while j < runs.len() && runs[j].range.is_some() && runs[j].prefix == run.prefix {
            j += 1;
        }
        out.push_str(run.prefix);
        if j == i + 1 && first.lo == first.hi {
            let _ = write!(out, "{:0w$}", first.lo, w = first.width);
        } else {
            out.push('[');
            for (k, r) in runs[i..j].iter().filter_map(|r| r.range).enumerate() {
                if k > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{:0w$}", r.lo, w = r.width);
                if r.hi > r.lo {
                    let _ = write!(out, "-{:0w$}", r.hi, w = r.width);
                }
            }
            out.push(']');
        }
        i = j;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ex(s: &str) -> Vec<String> {
        expand(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn expands_the_forms_scontrol_accepts() {
        let cases: &[(&str, &str)] = &[
            ("node[01-04,07],gpu-a[1-2]", "node01 node02 node03 node04 node07 gpu-a1 gpu-a2"),
            ("n[01-03]", "n01 n02 n03"),
            ("n[08-11]", "n08 n09 n10 n11"),
            ("n[9-11]", "n9 n10 n11"),
            ("n[1-010]", "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10"),
            ("n[001-3]", "n001 n002 n003"),
            ("n[01,3,005]", "n01 n3 n005"),
            ("rack[1-2]-n[01-02]", "rack1-n01 rack1-n02 rack2-n01 rack2-n02"),
            ("[1-3]", "1 2 3"),
            ("n1 n2", "n1 n2"),
            ("n[1-2],n[2-3]", "n1 n2 n2 n3"),
            ("host1.example.com,host2.example.com", "host1.example.com host2.example.com"),
            ("", ""),
        ];
        for (expr, want) in cases {
            assert_eq!(ex(expr).join(" "), *want, "{expr}");
        }
    }

    #[test]
    fn an_items_count_is_the_number_of_names_it_expands_to() {
        // The count refuses an item before expanding it; a range length off by one (or zero for a
        // single number) would let a too-large item start expanding, stopped only by the name-by-
        // name check.
        let g = |b: &str| parse_bracket(b).unwrap();
        for (groups, expr) in [
            (vec![g("0-1048575")], "n[0-1048575]"),
            (vec![g("7")], "n[7]"),
            (vec![g("1-3,5"), g("01-02")], "r[1-3,5]n[01-02]"),
            (vec![g("10-12"), g("3"), g("0-1")], "a[10-12]b[3]c[0-1]"),
        ] {
            assert_eq!(names_in(&groups), Some(expand(expr).unwrap().len() as u64), "{expr}");
        }
        assert_eq!(names_in(&[g("0-4294967295"), g("0-4294967295")]), None, "past u64");
        assert_eq!(names_in(&[]), Some(1), "an item without brackets is one name");
    }

    #[test]
    fn a_range_counts_both_ends_at_the_host_cap() {
        // n[0-1048575] is exactly MAX_HOSTS names; one more is refused. A range length off by one
        // (hi - lo) would let n[0-1048576] through.
        assert_eq!(expand("n[0-1048575]").unwrap().len(), MAX_HOSTS);
        assert!(matches!(expand("n[0-1048576]"), Err(e) if e.to_string().contains("more than")));
        // The same from 1: a length that added lo instead of subtracting it would refuse this.
        assert_eq!(expand("n[1-1048576]").unwrap().len(), MAX_HOSTS);
        assert!(matches!(expand("n[1-1048577]"), Err(e) if e.to_string().contains("more than")));
        assert_eq!(expand("n[7-7]").unwrap(), ["n7"]);
        assert_eq!(expand("n[1-3],m[0-1]").unwrap().len(), 5);
    }

    #[test]
    fn rejects_what_slurm_rejects_and_unclosed_brackets() {
        let cases: &[(&str, HostlistErrorKind)] = &[
            ("n[01-03]x", HostlistErrorKind::TextAfterBracket),
            ("n[0-2]-ib", HostlistErrorKind::TextAfterBracket),
            ("a[1-2]b[3-4]c", HostlistErrorKind::TextAfterBracket),
            ("n[[1-2]]", HostlistErrorKind::Nested),
            ("n[3-1]", HostlistErrorKind::Descending { lo: 3, hi: 1 }),
            ("n-[a-c]", HostlistErrorKind::NotNumeric("a".into())),
            ("n[1-3:2]", HostlistErrorKind::NotNumeric("3:2".into())),
            ("n[1-3", HostlistErrorKind::Unclosed),
            ("n1]", HostlistErrorKind::UnmatchedClose),
            ("n[]", HostlistErrorKind::EmptyRange),
            ("n[1,]", HostlistErrorKind::EmptyRange),
            ("n[1-]", HostlistErrorKind::NotNumeric(String::new())),
            ("n[0-99999999999]", HostlistErrorKind::TooMany),
            ("n[99999999999999999999]", HostlistErrorKind::Overflow("99999999999999999999".into())),
        ];
        for (expr, kind) in cases {
            let e = expand(expr).expect_err(expr);
            assert_eq!(&e.kind, kind, "{expr}");
        }
        assert_eq!(expand("a,n[1-3").unwrap_err().offset, 3);
        // An error inside a later item is placed in the whole expression: at the 'x'.
        assert_eq!(expand("a,n[1-x]").unwrap_err().offset, 6);
        // And inside a later bracket group of an item: at the 'y'.
        assert_eq!(expand("n[1-2]x[3-y]").unwrap_err().offset, 10);
        assert_eq!(expand("a,n[1-2]x[3-y]").unwrap_err().offset, 12);
        // And inside a later element of one bracket, past elements of different lengths: at the
        // 'x' both times.
        assert_eq!(expand("n[1-2,5-x]").unwrap_err().offset, 8);
        assert_eq!(expand("n[1,22,x]").unwrap_err().offset, 7);
        // Separators next to each other, or at either end, make no empty names.
        assert_eq!(expand(",a,,b ,").unwrap(), ["a", "b"]);
    }

    #[test]
    fn numbers_of_up_to_18_digits_are_taken_as_written() {
        // 18 digits is the widest number accepted, whatever its value; 19 are refused even where
        // the value fits u64 (leading zeros), as they do not fit Slurm's widths.
        assert_eq!(expand("n[000000000000000001]").unwrap(), ["n000000000000000001"]);
        assert_eq!(expand("n[999999999999999999]").unwrap(), ["n999999999999999999"]);
        let e = expand("n[0000000000000000001]").unwrap_err();
        assert_eq!(e.kind, HostlistErrorKind::Overflow("0000000000000000001".into()));
    }

    #[test]
    fn compresses_like_scontrol() {
        let cases: &[(&str, &str)] = &[
            ("n01,n02,n03,n05,gpu-a1,gpu-a2", "n[01-03,05],gpu-a[1-2]"),
            ("n1,n2,n3,n01,n02", "n[1-3,01-02]"),
            ("n9,n10,n11", "n[9-11]"),
            ("rack1-n01,rack1-n02,rack2-n01,rack2-n02", "rack1-n[01-02],rack2-n[01-02]"),
            ("n1,n1,n2", "n[1,1-2]"),
            ("login,n5", "login,n5"),
            ("1,2,3", "[1-3]"),
        ];
        for (hosts, want) in cases {
            let list: Vec<&str> = hosts.split(',').collect();
            assert_eq!(compress(&list).unwrap(), *want, "{hosts}");
            assert_eq!(ex(want), list, "{want}");
        }
        assert!(compress(&["a b"]).is_err());
        assert!(compress(&[""]).is_err());
    }

    fn host() -> impl Strategy<Value = String> {
        // Prefixes that end in a non-digit, then optional numbers with optional zero padding.
        ("[a-z][a-z0-9.-]{0,4}[a-z-]?", proptest::option::of((0u64..40, 0usize..4))).prop_map(|(p, n)| match n {
            Some((v, pad)) => format!("{p}{v:0w$}", w = pad),
            None => p,
        })
    }

    proptest! {
        #[test]
        fn expand_inverts_compress(hosts in proptest::collection::vec(host(), 0..40)) {
            let expr = compress(&hosts).unwrap();
            prop_assert_eq!(expand(&expr).unwrap(), hosts);
        }

        #[test]
        fn compress_inverts_expand_up_to_spelling(lo in 0u64..50, len in 0u64..50, w in 1usize..4) {
            let expr = format!("n[{lo:0w$}-{:0w$}]", lo + len);
            let hosts = expand(&expr).unwrap();
            prop_assert_eq!(hosts.len() as u64, len + 1);
            prop_assert_eq!(expand(&compress(&hosts).unwrap()).unwrap(), hosts);
        }

        #[test]
        fn arbitrary_text_never_panics(s in "[a-z0-9\\[\\],\\- ]{0,24}") {
            let _ = expand(&s);
        }
    }
}
