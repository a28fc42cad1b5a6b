//! An incremental Server-Sent Events parser: bytes in, whole events out, as the upstream
//! sends them (nothing waits for the end of the stream).

use bytes::{Buf, BytesMut};

/// One event: its `event:` name, if any, and its `data:` lines joined by `\n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub event: Option<String>,
    pub data: String,
}

/// An event larger than this without its blank line means the upstream is not speaking SSE.
const MAX_PENDING: usize = 4 * 1024 * 1024;

/// Reads the stream line by line, as the event-stream format defines it: a line ends at
/// CRLF, LF or a lone CR, and a blank line ends an event. The event being read is kept
/// between reads, so the same bytes give the same events however the reads split them.
#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes after the last complete line.
    buf: BytesMut,
    /// The last line ended at a CR that may be the first half of a CRLF split between reads:
    /// an LF at the start of the next read belongs to it, it is not a blank line.
    after_cr: bool,
    /// The unfinished event's `event:` name.
    event: Option<String>,
    /// The unfinished event's `data:` lines, joined by `\n`.
    data: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    #[error("event stream frame larger than {MAX_PENDING} bytes")]
    TooLarge,
    #[error("event stream is not UTF-8")]
    NotUtf8,
}

impl Parser {
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() + self.data.as_ref().map_or(0, String::len) > MAX_PENDING {
            return Err(SseError::TooLarge);
        }
        Ok(())
    }

    /// The next complete event, if the buffer holds one. Events without data (comments,
    /// keep-alives) are skipped.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, SseError> {
        loop {
            if self.after_cr && !self.buf.is_empty() {
                self.after_cr = false;
                if self.buf[0] == b'\n' {
                    self.buf.advance(1);
                }
            }
            let Some(end) = self.buf.iter().position(|b| matches!(b, b'\n' | b'\r')) else {
                return Ok(None);
            };
            let line = self.buf.split_to(end);
            self.after_cr = self.buf[0] == b'\r';
            self.buf.advance(1);
            if line.is_empty() {
                let event = self.event.take();
                if let Some(data) = self.data.take() {
                    return Ok(Some(Frame { event, data }));
                }
                continue;
            }
            let line = std::str::from_utf8(&line).map_err(|_| SseError::NotUtf8)?;
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "event" => self.event = Some(value.to_owned()),
                "data" => match &mut self.data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => self.data = Some(value.to_owned()),
                },
                _ => {}
            }
        }
    }

    /// Bytes received after the last complete event: an unfinished line, or the lines of an
    /// event whose blank line has not come.
    pub fn has_partial(&self) -> bool {
        self.data.is_some()
            || self.event.is_some()
            || self.buf.iter().any(|b| !b.is_ascii_whitespace())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_reads_come_out_whole() {
        let mut p = Parser::default();
        p.push(b"data: {\"a\":").unwrap();
        assert_eq!(p.next_frame().unwrap(), None);
        p.push(b"1}\n\ndata: [DONE]\n\n").unwrap();
        assert_eq!(p.next_frame().unwrap().unwrap().data, "{\"a\":1}");
        assert_eq!(p.next_frame().unwrap().unwrap().data, "[DONE]");
        assert_eq!(p.next_frame().unwrap(), None);
    }

    /// Found by the `sse` fuzz target (docs/fuzzing.md): a lone CR ends a line, and a blank
    /// line after LF-ended lines may be CRLF; the parser took only `\n\n`, `\r\n\r\n` and
    /// `\r\r` as event ends, and only LF or CRLF as line ends inside an event.
    #[test]
    fn every_line_ending_the_format_allows_ends_lines_and_events() {
        let mut p = Parser::default();
        p.push(b"data: a\n\r\nevent: e\rdata: b\r\n\ndata: c\r\r").unwrap();
        assert_eq!(p.next_frame().unwrap(), Some(Frame { event: None, data: "a".into() }));
        assert_eq!(
            p.next_frame().unwrap(),
            Some(Frame { event: Some("e".into()), data: "b".into() })
        );
        assert_eq!(p.next_frame().unwrap(), Some(Frame { event: None, data: "c".into() }));
        assert_eq!(p.next_frame().unwrap(), None);
        assert!(!p.has_partial());
    }

    /// A CRLF split between two reads is one line end, not a line end and a blank line.
    #[test]
    fn a_crlf_split_between_reads_is_one_line_end() {
        let mut p = Parser::default();
        p.push(b"data: a\r").unwrap();
        assert_eq!(p.next_frame().unwrap(), None);
        p.push(b"\ndata: b\r\n\r\n").unwrap();
        assert_eq!(p.next_frame().unwrap(), Some(Frame { event: None, data: "a\nb".into() }));
    }

    #[test]
    fn an_event_without_its_blank_line_is_partial() {
        let mut p = Parser::default();
        p.push(b"event: e\ndata: x\n").unwrap();
        assert_eq!(p.next_frame().unwrap(), None);
        assert!(p.has_partial());
    }

    #[test]
    fn event_names_comments_and_crlf() {
        let mut p = Parser::default();
        p.push(b": keep-alive\r\n\r\nevent: message_start\r\ndata: {}\r\n\r\n").unwrap();
        assert_eq!(
            p.next_frame().unwrap(),
            Some(Frame { event: Some("message_start".into()), data: "{}".into() })
        );
    }
}
