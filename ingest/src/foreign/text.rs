//! What every foreign format's reader does to a line and its figures before reading them: ANSI
//! colour escapes out, and figures that measure nothing (`nan`, `inf`, negative) no figures.

use std::borrow::Cow;

/// The line without its ANSI CSI escape sequences (`ESC [`, parameter and intermediate bytes, a
/// final byte: colours, `\x1b[0m`), which coloured loggers put around DeepSpeed's lines and
/// Trainer's dicts: inside a line they split its figures (`70.00\x1b[0m`) and hide its time stamp.
/// A line without an escape character is returned as it is, uncopied.
pub fn strip_ansi(line: &str) -> Cow<'_, str> {
    if !line.contains('\x1b') {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' && chars.peek() == Some(&'[') {
            chars.next();
            // Parameter bytes (0x30-0x3F) and intermediate bytes (0x20-0x2F), then the final byte
            // (0x40-0x7E); a sequence cut short by the line's end ends there.
            while chars.next_if(|c| ('\x20'..='\x3f').contains(c)).is_some() {}
            chars.next_if(|c| ('\x40'..='\x7e').contains(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A time, throughput, memory size or count as a foreign log prints it: a finite number of at
/// least 0, or no value. Rust's `f64` parser also takes `nan`, `inf` and `1e400` (infinite), and a
/// sign: none of those measures anything, so each is read as if the field were absent. Every
/// numeric field of the foreign formats ([`super::deepspeed`], [`super::hf_trainer`], [`super::nvidia_smi`])
/// is read through here (losses, which may be negative, only need to be finite).
pub fn quantity(text: &str) -> Option<f64> {
    checked(text.trim().parse().ok()?)
}

/// [`quantity`]'s rule for a number already computed (a value times its unit's multiplier, which
/// may overflow to infinity): finite and at least 0, else none; `-0` is `0`.
pub fn checked(v: f64) -> Option<f64> {
    (v.is_finite() && v >= 0.0).then_some(v + 0.0)
}
