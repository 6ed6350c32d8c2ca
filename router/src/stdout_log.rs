//! Where the process's log lines go on standard output, each cut to a bounded size.
//!
//! Owns: [`CappedStdout`], the writer the `tracing` fmt layer formats into. A log line can
//! carry what a client sent (a command name, a namespace, a user name, an error that quotes a
//! document), so no line is written longer than [`MAX_LINE`] bytes, as mongod's
//! `maxLogSizeKB` bounds its attributes.
//!
//! Invariants: one event is one write (the fmt layer formats a whole line, then writes it);
//! a line within the bound goes out unchanged; a longer text line goes out cut at a character
//! boundary with how long it was; a longer JSON line is replaced by a JSON line saying so,
//! with its first kilobyte, so every line stays one JSON document.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// The longest line written (mongod's `maxLogSizeKB` is 10 KiB per attribute; a line has
/// several).
pub const MAX_LINE: usize = 32 * 1024;

/// How much of a cut JSON line its replacement keeps.
const JSON_HEAD: usize = 1024;

/// Standard output for the fmt layer, each line at most [`MAX_LINE`] bytes.
#[derive(Debug, Clone, Copy)]
pub struct CappedStdout {
    pub json: bool,
}

impl<'a> MakeWriter<'a> for CappedStdout {
    type Writer = CappedLine<io::StdoutLock<'static>>;

    fn make_writer(&'a self) -> Self::Writer {
        CappedLine {
            out: io::stdout().lock(),
            json: self.json,
        }
    }
}

/// Writes each line it is given within [`MAX_LINE`] bytes.
pub struct CappedLine<W: Write> {
    out: W,
    json: bool,
}

impl<W: Write> CappedLine<W> {
    pub fn new(out: W, json: bool) -> CappedLine<W> {
        CappedLine { out, json }
    }
}

impl<W: Write> Write for CappedLine<W> {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        if line.len() <= MAX_LINE {
            self.out.write_all(line)?;
        } else if self.json {
            let text = String::from_utf8_lossy(&line[..JSON_HEAD.min(line.len())]);
            let replacement = serde_json::json!({
                "level": "WARN",
                "fields": {
                    "message": "a log line was too long to write",
                    "bytes": line.len(),
                    "head": text,
                },
                "target": "tributary::log",
            });
            writeln!(self.out, "{replacement}")?;
        } else {
            let text = String::from_utf8_lossy(line);
            let head = &text[..text.floor_char_boundary(MAX_LINE)];
            writeln!(self.out, "{head}… (cut from {} bytes)", line.len())?;
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(line: &[u8], json: bool) -> String {
        let mut out = Vec::new();
        let mut w = CappedLine::new(&mut out, json);
        w.write_all(line).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_line_within_the_bound_is_written_unchanged() {
        let line = "2026-12-04 INFO Slow query command=find\n";
        assert_eq!(written(line.as_bytes(), false), line);
        assert_eq!(written(line.as_bytes(), true), line);
    }

    #[test]
    fn a_long_text_line_is_cut_at_a_character_boundary() {
        let line = format!("INFO Slow query command={}\n", "é".repeat(MAX_LINE));
        let out = written(line.as_bytes(), false);
        assert!(out.len() < MAX_LINE + 64, "{}", out.len());
        assert!(out.ends_with(&format!("… (cut from {} bytes)\n", line.len())));
        assert_eq!(out.matches('\n').count(), 1);
    }

    #[test]
    fn a_long_json_line_is_replaced_by_one_json_document() {
        let line = format!(
            "{{\"level\":\"INFO\",\"fields\":{{\"command\":\"{}\"}}}}\n",
            "x".repeat(4 * MAX_LINE)
        );
        let out = written(line.as_bytes(), true);
        assert!(out.len() < 2 * JSON_HEAD, "{}", out.len());
        assert_eq!(out.matches('\n').count(), 1);
        let doc: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(doc["fields"]["bytes"], line.len());
        assert_eq!(doc["level"], "WARN");
    }
}
