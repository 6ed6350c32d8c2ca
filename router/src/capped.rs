//! Text that stops growing at a limit: a formatter writing into [`CappedText`] fails once the
//! limit is reached, so a 16 MiB value formatted into it costs the limit, not 16 MiB (log
//! fields, `currentOp`'s view of a large command).
//!
//! Invariant: the text is at most `limit` bytes and ends on a character boundary; `cut` says
//! whether anything was dropped.

use std::fmt;

pub(crate) struct CappedText {
    text: String,
    limit: usize,
    cut: bool,
}

impl CappedText {
    pub(crate) fn new(limit: usize) -> CappedText {
        CappedText {
            text: String::new(),
            limit,
            cut: false,
        }
    }

    /// The text, and whether anything past the limit was dropped.
    pub(crate) fn into_parts(self) -> (String, bool) {
        (self.text, self.cut)
    }
}

impl fmt::Write for CappedText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.limit.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
            return Ok(());
        }
        self.text.push_str(&s[..s.floor_char_boundary(room)]);
        self.cut = true;
        // Stop the formatting: nothing more fits.
        Err(fmt::Error)
    }
}

/// `value` formatted and cut at `limit` bytes; whether it was cut.
pub(crate) fn format_capped(value: impl fmt::Display, limit: usize) -> (String, bool) {
    let mut out = CappedText::new(limit);
    let _ = fmt::Write::write_fmt(&mut out, format_args!("{value}"));
    out.into_parts()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_stops_at_the_limit_on_a_character_boundary() {
        assert_eq!(format_capped("short", 10), ("short".to_string(), false));
        // "é" is two bytes: a limit inside it keeps the character out.
        assert_eq!(format_capped("abcé", 4), ("abc".to_string(), true));
        let (text, cut) = format_capped(format_args!("{}", "x".repeat(1 << 20)), 100);
        assert_eq!((text.len(), cut), (100, true));
    }
}
