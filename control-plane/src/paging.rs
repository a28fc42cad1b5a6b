//! Paged listings of the admin API (`ListKeys`, `ListNodes`): a page is read from the store
//! a slice at a time, so answering it costs a page, not the whole prefix, and every answer
//! stays far below gRPC's 4 MiB message limit.
//!
//! The page token is the store key (below the listing's prefix) of the last record looked
//! at, hex-encoded behind a tag naming the listing: opaque to clients, and a token of one
//! listing handed to another is refused rather than read as a position.

use crate::store::{KeyValue, Store, StoreError};

/// The most records one page holds, whatever the client asks for.
pub const PAGE_MAX: usize = 1_000;
/// The most encoded bytes of records one page holds (at least one record).
pub const PAGE_BYTES: usize = 1 << 20;
/// The most records a paged request reads from the store: with a filter that few records
/// pass, a page ends early (even empty) with a token rather than reading a million keys.
pub const SCAN_MAX: usize = 10_000;
/// The most encoded bytes an unpaged request (a client from before paging) gets in its one
/// response; past it the request fails and says to page.
pub const UNPAGED_BYTES: usize = 3 << 20;
/// Records read from the store at once.
const STORE_SLICE: usize = 500;

/// Which listing a token belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    Keys,
    Nodes,
}

impl Listing {
    fn tag(self) -> &'static str {
        match self {
            Self::Keys => "k1.",
            Self::Nodes => "n1.",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PagingError {
    #[error("page_token: not a token from a previous {0} listing")]
    BadToken(&'static str),
    /// An unpaged request whose answer would not fit one response.
    #[error(
        "the {what} listing is larger than one response ({limit} MiB); ask for pages \
         (limit and page_token; `switchyard` {version} and later page by itself)"
    )]
    TooLarge { what: &'static str, limit: usize, version: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How a request wants its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Neither `limit` nor `page_token`: everything, in one response, as before paging.
    Unpaged,
    /// Up to `limit` records after the store key suffix `after` (from the start if `None`).
    Paged { limit: usize, after: Option<String> },
}

/// The mode of a request's `limit` and `page_token`.
pub fn mode(listing: Listing, limit: u32, token: &str) -> Result<Mode, PagingError> {
    if limit == 0 && token.is_empty() {
        return Ok(Mode::Unpaged);
    }
    let limit = match usize::try_from(limit) {
        Ok(0) | Err(_) => PAGE_MAX,
        Ok(n) => n.min(PAGE_MAX),
    };
    let after = if token.is_empty() { None } else { Some(decode_token(listing, token)?) };
    Ok(Mode::Paged { limit, after })
}

/// The token that continues after the record whose key below the prefix is `suffix`.
pub fn encode_token(listing: Listing, suffix: &str) -> String {
    format!("{}{}", listing.tag(), hex::encode(suffix))
}

pub fn decode_token(listing: Listing, token: &str) -> Result<String, PagingError> {
    let what = match listing {
        Listing::Keys => "keys",
        Listing::Nodes => "nodes",
    };
    let bad = || PagingError::BadToken(what);
    let digits = token.strip_prefix(listing.tag()).ok_or_else(bad)?;
    if digits.is_empty() {
        return Err(bad());
    }
    let bytes = hex::decode(digits).map_err(|_| bad())?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// One page of a listing: the records and the token of the next page (empty at the end).
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_token: String,
}

/// Reads the records under `prefix` whose key below it starts with `narrow` (a cheap filter:
/// a range of the store), keeping what `accept` turns into an item (`None`: filtered out),
/// as `mode` asks. `size` is an item's encoded size, for the byte bounds.
pub async fn scan<T, E>(
    store: &dyn Store,
    listing: Listing,
    prefix: &str,
    narrow: &str,
    mode: &Mode,
    mut accept: impl FnMut(&KeyValue) -> Result<Option<T>, E>,
    size: impl Fn(&T) -> usize,
) -> Result<Page<T>, E>
where
    E: From<PagingError>,
{
    let range = format!("{prefix}{narrow}");
    let (max_items, max_bytes, max_scan) = match mode {
        Mode::Unpaged => (usize::MAX, UNPAGED_BYTES, usize::MAX),
        Mode::Paged { limit, .. } => (*limit, PAGE_BYTES, SCAN_MAX),
    };
    let mut from = match mode {
        // Just past the last record of the previous page.
        Mode::Paged { after: Some(after), .. } => format!("{prefix}{after}\0"),
        _ => range.clone(),
    };
    let (mut items, mut bytes, mut scanned) = (Vec::new(), 0usize, 0usize);
    let what = match listing {
        Listing::Keys => "keys",
        Listing::Nodes => "nodes",
    };
    // The record looked at last: a page that ends before the record in hand ends here.
    let mut last_seen = String::new();
    loop {
        let slice = store.list_page(&range, &from, STORE_SLICE).await.map_err(PagingError::from)?;
        let Some(last) = slice.kvs.last() else {
            return Ok(Page { items, next_token: String::new() });
        };
        from = format!("{}\0", last.key);
        for kv in &slice.kvs {
            let suffix = kv.key.strip_prefix(prefix).unwrap_or(&kv.key);
            if let Some(item) = accept(kv)? {
                let item_bytes = size(&item);
                if bytes + item_bytes > max_bytes {
                    if *mode == Mode::Unpaged {
                        let limit = UNPAGED_BYTES >> 20;
                        let version = env!("CARGO_PKG_VERSION");
                        return Err(PagingError::TooLarge { what, limit, version }.into());
                    }
                    if !items.is_empty() {
                        // This record starts the next page.
                        return Ok(Page { items, next_token: encode_token(listing, &last_seen) });
                    }
                }
                bytes += item_bytes;
                items.push(item);
            }
            scanned += 1;
            if items.len() >= max_items || scanned >= max_scan {
                return Ok(Page { items, next_token: encode_token(listing, suffix) });
            }
            suffix.clone_into(&mut last_seen);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::embedded::EmbeddedStore;

    #[test]
    fn a_token_round_trips_any_key_and_names_its_listing() {
        for suffix in ["key_abc", "node/with/slashes", "ünï%2F", "a\u{0}b"] {
            let token = encode_token(Listing::Nodes, suffix);
            assert!(token.starts_with("n1."), "{token}");
            assert_eq!(decode_token(Listing::Nodes, &token).unwrap(), suffix);
        }
    }

    #[test]
    fn a_token_of_another_listing_or_mangled_is_refused_naming_the_field() {
        let keys = encode_token(Listing::Keys, "key_abc");
        for bad in [
            encode_token(Listing::Nodes, "key_abc"),
            "k1.".to_owned(),
            "k1.6".to_owned(),
            "k1.zz".to_owned(),
            "key_abc".to_owned(),
            "k1.ff".to_owned(), // not UTF-8
        ] {
            let e = decode_token(Listing::Keys, &bad).unwrap_err();
            assert!(e.to_string().starts_with("page_token: "), "{bad}: {e}");
        }
        assert!(decode_token(Listing::Keys, &keys).is_ok());
    }

    #[test]
    fn no_limit_nor_token_is_unpaged_and_a_page_is_capped() {
        assert_eq!(mode(Listing::Keys, 0, "").unwrap(), Mode::Unpaged);
        assert_eq!(mode(Listing::Keys, 5, "").unwrap(), Mode::Paged { limit: 5, after: None });
        assert_eq!(
            mode(Listing::Keys, 50_000, "").unwrap(),
            Mode::Paged { limit: PAGE_MAX, after: None }
        );
        let token = encode_token(Listing::Keys, "k");
        assert_eq!(
            mode(Listing::Keys, 0, &token).unwrap(),
            Mode::Paged { limit: PAGE_MAX, after: Some("k".into()) }
        );
    }

    async fn store_with(n: usize, value_len: usize) -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).await.unwrap();
        let mut success = Vec::new();
        for i in 0..n {
            let value = vec![b'x'; value_len];
            success.push(crate::store::TxnOp::Put { key: format!("p/{i:05}"), value, lease: None });
            if success.len() == 128 || i + 1 == n {
                let txn = crate::store::Txn {
                    success: std::mem::take(&mut success),
                    ..Default::default()
                };
                store.txn(txn).await.unwrap();
            }
        }
        // A neighbour that must never show up.
        store.put("p0", b"x".to_vec(), None).await.unwrap();
        (dir, store)
    }

    /// Pages through `p/` with `mode_of(token)`, keeping the keys `keep` accepts.
    /// One page of the keys under `p/` that `keep` wants.
    async fn key_page(
        store: &EmbeddedStore,
        m: &Mode,
        narrow: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Page<String> {
        let wanted = |kv: &KeyValue| Ok::<_, PagingError>(keep(&kv.key).then(|| kv.key.clone()));
        scan(store, Listing::Keys, "p/", narrow, m, wanted, String::len).await.unwrap()
    }

    async fn all_pages(
        store: &EmbeddedStore,
        limit: u32,
        narrow: &str,
        keep: impl Fn(&str) -> bool,
    ) -> (Vec<String>, usize) {
        let (mut keys, mut pages, mut token) = (Vec::new(), 0, String::new());
        loop {
            let m = mode(Listing::Keys, limit, &token).unwrap();
            let page = key_page(store, &m, narrow, &keep).await;
            assert!(page.items.len() <= limit as usize);
            keys.extend(page.items);
            pages += 1;
            if page.next_token.is_empty() {
                return (keys, pages);
            }
            token = page.next_token;
        }
    }

    #[tokio::test]
    async fn pages_list_every_record_once_in_order() {
        let (_dir, store) = store_with(2_500, 4).await;
        let (keys, pages) = all_pages(&store, 1_000, "", |_| true).await;
        let expected: Vec<String> = (0..2_500).map(|i| format!("p/{i:05}")).collect();
        assert_eq!(keys, expected);
        // Three full or partial pages, and at most one empty one saying "the end".
        assert!((3..=4).contains(&pages), "{pages} pages");
        let (keys, _) = all_pages(&store, 7, "", |_| true).await;
        assert_eq!(keys, expected, "odd page sizes lose nothing at slice edges");
    }

    #[tokio::test]
    async fn a_narrowing_prefix_reads_only_its_range() {
        let (_dir, store) = store_with(2_500, 4).await;
        let (keys, _) = all_pages(&store, 1_000, "012", |_| true).await;
        let expected: Vec<String> = (1_200..1_300).map(|i| format!("p/{i:05}")).collect();
        assert_eq!(keys, expected);
    }

    #[tokio::test]
    async fn a_rare_filter_ends_pages_early_with_a_token_and_finds_everything() {
        let (_dir, store) = store_with(25_000, 1).await;
        let wanted = |key: &str| key.ends_with("777");
        let m = mode(Listing::Keys, 10, "").unwrap();
        let first = key_page(&store, &m, "", wanted).await;
        assert_eq!(
            first.items,
            [
                "p/00777", "p/01777", "p/02777", "p/03777", "p/04777", "p/05777", "p/06777",
                "p/07777", "p/08777", "p/09777"
            ]
        );
        let (keys, _) = all_pages(&store, 1_000, "", wanted).await;
        let expected: Vec<String> = (0..25).map(|i| format!("p/{i:02}777")).collect();
        assert_eq!(keys, expected, "a page reads at most {SCAN_MAX} records, and pages go on");
        // The first page stopped after SCAN_MAX records, with fewer keys than asked.
        let m = mode(Listing::Keys, 1_000, "").unwrap();
        let page = key_page(&store, &m, "", wanted).await;
        assert_eq!(page.items.len(), 10);
        assert_eq!(page.next_token, encode_token(Listing::Keys, "09999"));
    }

    #[tokio::test]
    async fn a_page_stays_under_its_byte_bound_and_an_unpaged_answer_too_large_is_refused() {
        let (_dir, store) = store_with(40, 100_000).await;
        let m = mode(Listing::Keys, 1_000, "").unwrap();
        let page = scan(
            &store,
            Listing::Keys,
            "p/",
            "",
            &m,
            |kv| Ok::<_, PagingError>(Some(kv.value.len())),
            |n| *n,
        )
        .await
        .unwrap();
        assert_eq!(page.items.len(), PAGE_BYTES / 100_000);
        assert_eq!(page.next_token, encode_token(Listing::Keys, "00009"));
        let e = scan(
            &store,
            Listing::Keys,
            "p/",
            "",
            &Mode::Unpaged,
            |kv| Ok::<_, PagingError>(Some(kv.value.len())),
            |n| *n,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, PagingError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("page_token"), "{e}");
        // Small enough: everything in one answer, no token.
        let page = scan(
            &store,
            Listing::Keys,
            "p/",
            "0000",
            &Mode::Unpaged,
            |kv| Ok::<_, PagingError>(Some(kv.value.len())),
            |n| *n,
        )
        .await
        .unwrap();
        assert_eq!((page.items.len(), page.next_token.as_str()), (10, ""));
    }
}
