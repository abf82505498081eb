//! Quoting for the three readers of a rendered script: bash, sbatch's `#SBATCH` parser, and
//! Slurm's filename patterns.
//!
//! Every value a user controls goes through one of these; the injection test in
//! `tests/it/injection.rs` runs rendered scripts with hostile values under bash to prove it.

use std::borrow::Cow;

/// Characters that need no quoting anywhere in a shell word. `=` is left out so that a quoted
/// word can never read as an assignment, `~` so that it is never expanded.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b',' | b':' | b'+' | b'@' | b'%' | b'-')
}

/// One bash word that stands for exactly `s`, on one line: as-is when it is plain; in single
/// quotes, where bash interprets nothing (a `'` becomes `'\''`; `$`, backticks and `;` are
/// literal); and when `s` holds a control character (a line break), in bash's `$'...'` with the
/// character escaped, so the word never spans lines that the renderer wraps and indents.
pub fn sh(s: &str) -> Cow<'_, str> {
    if !s.is_empty() && s.bytes().all(plain) && !s.starts_with('-') {
        return Cow::Borrowed(s);
    }
    if s.chars().any(char::is_control) {
        let mut q = String::with_capacity(s.len() + 3);
        q.push_str("$'");
        for c in s.chars() {
            match c {
                '\\' => q.push_str("\\\\"),
                '\'' => q.push_str("\\'"),
                '\n' => q.push_str("\\n"),
                '\r' => q.push_str("\\r"),
                '\t' => q.push_str("\\t"),
                // Its UTF-8 bytes, which `\xHH` gives back in any locale.
                c if c.is_control() => {
                    let mut utf8 = [0u8; 4];
                    for b in c.encode_utf8(&mut utf8).bytes() {
                        q.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => q.push(c),
            }
        }
        q.push('\'');
        return Cow::Owned(q);
    }
    let mut q = String::with_capacity(s.len() + 2);
    q.push('\'');
    for c in s.chars() {
        if c == '\'' {
            q.push_str("'\\''");
        } else {
            q.push(c);
        }
    }
    q.push('\'');
    Cow::Owned(q)
}

/// Like [`sh`], but options (`--model`) stay bare; only used for words the renderer itself writes
/// or that start with `-` by design.
pub fn sh_arg(s: &str) -> Cow<'_, str> {
    // A word starting with '-' cannot be read as an assignment, so `--mpi=pmix` may stay bare.
    if s.len() > 1 && s.starts_with('-') && s.bytes().all(|b| plain(b) || b == b'=') {
        return Cow::Borrowed(s);
    }
    sh(s)
}

/// A value that cannot be put on an `#SBATCH` line: sbatch reads one line per directive, and for
/// bash the line is a comment only up to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} cannot be written into an #SBATCH line: {why}")]
pub struct DirectiveError {
    pub what: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// A value for an `#SBATCH --opt=VALUE` line. sbatch splits directives like a shell: whitespace
/// separates, `'` and `"` group, `\` escapes the next character and an unquoted `#` starts a
/// comment (Slurm's `_get_argument`). Plain values stay bare; others are double-quoted with `\`
/// and `"` escaped.
pub fn sbatch_value<'a>(what: &'static str, s: &'a str) -> Result<Cow<'a, str>, DirectiveError> {
    if s.contains(['\n', '\r', '\0']) {
        return Err(DirectiveError { what, value: s.to_string(), why: "it holds a line break or NUL" });
    }
    if !s.is_empty() && s.bytes().all(plain) {
        return Ok(Cow::Borrowed(s));
    }
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\') {
            q.push('\\');
        }
        q.push(c);
    }
    q.push('"');
    Ok(Cow::Owned(q))
}

/// A literal path inside a Slurm filename pattern (`--output`): `%` is doubled so that only the
/// renderer's own `%x`, `%j`, `%A`, `%a` are replaced. A backslash would switch replacement off
/// for the whole pattern, so paths with one are refused.
pub fn slurm_pattern_literal<'a>(what: &'static str, s: &'a str) -> Result<Cow<'a, str>, DirectiveError> {
    if s.contains('\\') {
        return Err(DirectiveError {
            what,
            value: s.to_string(),
            why: "a backslash turns Slurm's %j/%x replacement off",
        });
    }
    Ok(if s.contains('%') { Cow::Owned(s.replace('%', "%%")) } else { Cow::Borrowed(s) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::process::Command;

    fn bash_echo(words: &[String]) -> Vec<u8> {
        let script = format!("printf '%s\\0' {}", words.join(" "));
        let out = Command::new("bash").arg("-c").arg(&script).output().expect("bash runs");
        assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    }

    #[test]
    fn quotes_what_needs_quoting() {
        assert_eq!(sh("gpt2-xl"), "gpt2-xl");
        assert_eq!(sh(""), "''");
        assert_eq!(sh("a b"), "'a b'");
        assert_eq!(sh("it's"), "'it'\\''s'");
        assert_eq!(sh("A=B"), "'A=B'");
        assert_eq!(sh("-rf"), "'-rf'");
        assert_eq!(sh("a\nb.txt"), "$'a\\nb.txt'");
        assert_eq!(sh("it's\r\t\\\u{1b}\u{85}"), "$'it\\'s\\r\\t\\\\\\x1b\\xc2\\x85'");
        assert_eq!(sh_arg("--model"), "--model");
        assert_eq!(sh_arg("--mpi=pmix"), "--mpi=pmix");
        assert_eq!(sh_arg("--x=$(id)"), "'--x=$(id)'");
        // A lone `-` is not an option: quoted like any other word starting with `-`.
        assert_eq!(sh_arg("-"), "'-'");
        assert_eq!(sbatch_value("x", "gpu").unwrap(), "gpu");
        assert_eq!(sbatch_value("x", "/a b/\"c\"#d\\").unwrap(), r##""/a b/\"c\"#d\\""##);
        assert!(sbatch_value("x", "a\nb").is_err());
        assert_eq!(slurm_pattern_literal("x", "/r/100%").unwrap(), "/r/100%%");
        assert!(slurm_pattern_literal("x", "/a\\b").is_err());
    }

    #[test]
    fn hostile_words_come_back_verbatim_from_bash() {
        let hostile = [
            "$(touch /tmp/zb-pwned)",
            "`id`",
            "a;b",
            "x\ny",
            "'",
            "\"$HOME\"",
            "*",
            "~",
            "${IFS}",
            "!!",
            "\\",
            "$'x\n\\'",
        ];
        let words: Vec<String> = hostile.iter().map(|s| sh(s).into_owned()).collect();
        let want: Vec<u8> = hostile.iter().flat_map(|s| s.bytes().chain([0])).collect();
        assert_eq!(bash_echo(&words), want);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn bash_reads_back_any_quoted_string(v in proptest::collection::vec("[^\\x00]{0,12}", 1..6)) {
            let words: Vec<String> = v.iter().map(|s| sh(s).into_owned()).collect();
            let want: Vec<u8> = v.iter().flat_map(|s| s.bytes().chain([0])).collect();
            prop_assert_eq!(bash_echo(&words), want);
        }
    }
}
