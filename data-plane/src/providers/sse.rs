//! An incremental Server-Sent Events parser: bytes in, whole events out, as the upstream
//! sends them (nothing waits for the end of the stream).

use bytes::{Buf, BytesMut};

/// One event: its `event:` name, if any, and its `data:` lines joined by `\n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub event: Option<String>,
    pub data: String,
}

/// Lines longer than this without an event boundary mean the upstream is not speaking SSE.
const MAX_PENDING: usize = 4 * 1024 * 1024;

#[derive(Debug, Default)]
pub struct Parser {
    buf: BytesMut,
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
        if self.buf.len() > MAX_PENDING {
            return Err(SseError::TooLarge);
        }
        Ok(())
    }

    /// The next complete event, if the buffer holds one. Events without data (comments,
    /// keep-alives) are skipped.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, SseError> {
        loop {
            let Some((end, sep)) = boundary(&self.buf) else { return Ok(None) };
            let raw = self.buf.split_to(end);
            self.buf.advance(sep);
            let text = std::str::from_utf8(&raw).map_err(|_| SseError::NotUtf8)?;
            let mut event = None;
            let mut data: Option<String> = None;
            for line in text.lines() {
                let (field, value) = match line.split_once(':') {
                    Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                    None => (line, ""),
                };
                match field {
                    "event" => event = Some(value.to_owned()),
                    "data" => match &mut data {
                        Some(d) => {
                            d.push('\n');
                            d.push_str(value);
                        }
                        None => data = Some(value.to_owned()),
                    },
                    _ => {}
                }
            }
            if let Some(data) = data {
                return Ok(Some(Frame { event, data }));
            }
        }
    }

    /// Bytes received after the last complete event.
    pub fn has_partial(&self) -> bool {
        self.buf.iter().any(|b| !b.is_ascii_whitespace())
    }
}

/// Position and length of the first blank-line separator (`\n\n`, `\r\n\r\n`, `\r\r`).
fn boundary(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < buf.len() {
        match buf[i] {
            b'\n' if buf.get(i + 1) == Some(&b'\n') => return Some((i, 2)),
            b'\r' if buf[i..].starts_with(b"\r\n\r\n") => return Some((i, 4)),
            b'\r' if buf.get(i + 1) == Some(&b'\r') => return Some((i, 2)),
            _ => i += 1,
        }
    }
    None
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
