//! Text that stops growing at a limit: a formatter writing into [`CappedText`] fails once the
//! limit is reached, so a 16 MiB value formatted into it costs the limit, not 16 MiB (log
//! fields, `currentOp`'s view of a large command, a client's value shown in an error message:
//! [`for_message`]).
//!
//! Invariant: the text is at most `limit` bytes and ends on a character boundary; `cut` says
//! whether anything was dropped.

use std::fmt;

/// Text written through [`fmt::Write`], kept up to a limit.
pub struct CappedText {
    text: String,
    limit: usize,
    cut: bool,
}

impl CappedText {
    pub fn new(limit: usize) -> CappedText {
        CappedText {
            text: String::new(),
            limit,
            cut: false,
        }
    }

    /// The text, and whether anything past the limit was dropped.
    pub fn into_parts(self) -> (String, bool) {
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
pub fn format_capped(value: impl fmt::Display, limit: usize) -> (String, bool) {
    let mut out = CappedText::new(limit);
    let _ = fmt::Write::write_fmt(&mut out, format_args!("{value}"));
    out.into_parts()
}

/// How much of a client's value an error message shows, in bytes.
pub const MESSAGE_VALUE_LIMIT: usize = 1024;

/// `value` as an error message shows it: at most [`MESSAGE_VALUE_LIMIT`] bytes, then `...`
/// when there was more.
pub fn for_message(value: impl fmt::Display) -> String {
    let (mut text, cut) = format_capped(value, MESSAGE_VALUE_LIMIT);
    if cut {
        text.push_str("...");
    }
    text
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

    #[test]
    fn a_message_shows_a_large_value_cut_and_marked() {
        assert_eq!(for_message(42), "42");
        let huge = bson::Bson::Array(vec![bson::Bson::Int32(7); 1 << 20]);
        let shown = for_message(&huge);
        assert_eq!(shown.len(), MESSAGE_VALUE_LIMIT + 3);
        assert!(
            shown.starts_with("[7, 7") && shown.ends_with("..."),
            "{shown}"
        );
    }
}
