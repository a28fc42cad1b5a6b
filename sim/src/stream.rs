//! Writing a streamed answer: the pacing and the scripted faults (stall, drop, in-band error
//! after K pieces) are the same for every provider; only the framing differs, and each wire
//! format module supplies it as a [`StreamWire`].

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::behaviour::{Reply, sleep_ms};
use crate::body::{Chunk, SimBody};

/// One provider's stream framing around the content pieces.
pub trait StreamWire: Send + 'static {
    /// The frames before the first content piece.
    fn head(&self) -> Vec<Bytes>;
    /// One content piece.
    fn content(&self, piece: &str) -> Bytes;
    /// The in-band error frame of a stream that fails after it started.
    fn error(&self, message: &str) -> Bytes;
    /// A frame whose data is not JSON.
    fn bad_frame(&self) -> Bytes;
    /// The frames after the last piece (`text` is the whole content), ending the stream;
    /// without the end marker when `marker` is false.
    fn tail(&self, text: &str, marker: bool) -> Vec<Bytes>;
}

/// Everything a stream task needs, owned, so it outlives the handler.
pub struct StreamPlan {
    wire: Box<dyn StreamWire>,
    text: String,
    chunks: u32,
    first_token_delay_ms: u64,
    chunk_delay_ms: u64,
    stall_after: Option<u32>,
    drop_after: Option<u32>,
    no_done: bool,
    bad_frame_after: Option<u32>,
    error_after: Option<(u32, String)>,
    /// A continuation: the bytes of `text` the client already has (its prefill).
    skip: usize,
}

impl StreamPlan {
    pub fn new(
        wire: Box<dyn StreamWire>,
        text: String,
        reply: &Reply,
        error_after: Option<(u32, String)>,
    ) -> Self {
        StreamPlan {
            wire,
            text,
            chunks: reply.chunks,
            first_token_delay_ms: reply.first_token_delay_ms,
            chunk_delay_ms: reply.chunk_delay_ms,
            stall_after: reply.stall_after,
            drop_after: reply.drop_after,
            no_done: reply.no_done,
            bad_frame_after: reply.bad_frame_after,
            error_after,
            skip: 0,
        }
    }

    /// Sends only what follows the first `skip` bytes of the text (a prefill the request
    /// ended with): the whole text is cut into its pieces as usual, and the stream sends the
    /// rest of the piece the prefill ends in, then the pieces after it. The faults count
    /// the pieces this stream sends, like a real provider's stream of its own.
    pub fn continuing(mut self, skip: usize) -> Self {
        self.skip = skip;
        self
    }

    /// Starts the stream task and returns the body it feeds.
    pub fn spawn(self) -> SimBody {
        // A small buffer: the task runs ahead of the socket by a few frames at most, and a
        // client that stops reading stops the task through back-pressure.
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            // Err means the body was dropped (client gone): nothing left to do.
            let _ = self.run(&tx).await;
        });
        SimBody::Channel(rx)
    }

    async fn run(self, tx: &mpsc::Sender<Chunk>) -> Result<(), Gone> {
        for frame in self.wire.head() {
            send(tx, frame).await?;
        }
        let pieces = rest_of_pieces(&self.text, self.chunks, self.skip);
        for i in 0..=pieces.len() {
            let sent = u32::try_from(i).unwrap_or(u32::MAX);
            let last = i == pieces.len();
            // A fault "after K chunks" with K past the end happens after the last chunk.
            let due = |k: Option<u32>| k.is_some_and(|k| k == sent || (last && k > sent));
            if due(self.stall_after) {
                tx.closed().await;
                return Err(Gone);
            }
            if due(self.drop_after) {
                // hyper drops its unflushed output when a body fails, so let it take and flush
                // what was sent first: the client must see exactly K chunks, then the drop.
                while tx.capacity() < tx.max_capacity() {
                    if tx.is_closed() {
                        return Err(Gone);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                // A FIN, not an RST: an RST would make the client's kernel discard chunks it
                // has not read yet. The chunked body still ends without its terminator, which
                // clients report as a connection closed mid-message.
                let _ = tx.send(Chunk::Abort).await;
                return Ok(());
            }
            if let Some((_, message)) = self.error_after.as_ref().filter(|(k, _)| due(Some(*k))) {
                return send(tx, self.wire.error(message)).await;
            }
            if due(self.bad_frame_after) {
                send(tx, self.wire.bad_frame()).await?;
            }
            if last {
                break;
            }
            sleep_ms(if i == 0 { self.first_token_delay_ms } else { self.chunk_delay_ms }).await;
            send(tx, self.wire.content(pieces[i])).await?;
        }
        // Usage counts what this call generated: the continuation only.
        let generated = self.text.get(self.skip..).unwrap_or_default();
        for frame in self.wire.tail(generated, !self.no_done) {
            send(tx, frame).await?;
        }
        Ok(())
    }
}

/// A stream of fixed frames that then ends (a malformed stream, a function call sent whole).
pub fn fixed(frames: Vec<Bytes>) -> SimBody {
    let (tx, rx) = mpsc::channel(frames.len().max(1));
    for frame in frames {
        // The channel holds every frame, so these sends cannot fail for lack of room.
        let _ = tx.try_send(Chunk::Data(frame));
    }
    SimBody::Channel(rx)
}

/// The client went away.
struct Gone;

async fn send(tx: &mpsc::Sender<Chunk>, bytes: Bytes) -> Result<(), Gone> {
    tx.send(Chunk::Data(bytes)).await.map_err(|_| Gone)
}

/// `text` cut into exactly `n` contiguous pieces of near-equal character counts (some empty
/// when the text is shorter than `n`), so the concatenation is always the text.
pub fn pieces(text: &str, n: u32) -> Vec<&str> {
    let n = n.max(1) as usize;
    let bounds: Vec<usize> =
        text.char_indices().map(|(i, _)| i).chain(std::iter::once(text.len())).collect();
    let chars = bounds.len() - 1;
    (0..n)
        .map(|i| {
            let start = bounds[i * chars / n];
            let end = bounds[(i + 1) * chars / n];
            &text[start..end]
        })
        .collect()
}

/// The pieces of `text` cut into `n` that a continuation from byte `skip` sends: the rest of
/// the piece `skip` falls in (when it falls inside one), then every later piece.
pub fn rest_of_pieces(text: &str, n: u32, skip: usize) -> Vec<&str> {
    if skip == 0 {
        return pieces(text, n);
    }
    let mut start = 0;
    let mut rest = Vec::new();
    for piece in pieces(text, n) {
        let end = start + piece.len();
        if end > skip {
            // `skip` is a prefix's length, so it lies on a character boundary.
            rest.push(text.get(skip.max(start)..end).unwrap_or_default());
        }
        start = end;
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_text_exactly() {
        let p = pieces("Hello from m.", 5);
        assert_eq!(p.len(), 5);
        assert_eq!(p.concat(), "Hello from m.");
        let p = pieces("héé", 5);
        assert_eq!((p.len(), p.concat()), (5, "héé".to_owned()));
        assert_eq!(pieces("", 3), vec!["", "", ""]);
    }

    #[test]
    fn a_continuation_sends_the_rest_of_the_cut_piece_then_the_later_pieces() {
        let text = "Hello from m/one.";
        let all = pieces(text, 5);
        assert_eq!(rest_of_pieces(text, 5, 0), all);
        // A prefill that ends exactly after two pieces: the last three, whole.
        let two = all[0].len() + all[1].len();
        assert_eq!(rest_of_pieces(text, 5, two), all[2..].to_vec());
        // One that ends inside the third piece: its rest, then the last two.
        let mid = two + 1;
        let rest = rest_of_pieces(text, 5, mid);
        assert_eq!(rest.len(), 3);
        assert_eq!(rest[0], &all[2][1..]);
        assert_eq!(rest.concat(), &text[mid..]);
        assert!(rest_of_pieces(text, 5, text.len()).is_empty());
    }
}
