//! The five drill scenarios judged from what the drill observed (docs/cli.md, "`drill`"):
//! one [`Expectation`] per promise, each with the figures behind its verdict.
//! Pure functions of the observations, so every verdict is unit-tested without a fleet.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::drill::observe::Observation;

/// How long an all-down answer may take: a designed answer comes fast, never a spinner.
pub const ALL_DOWN_ANSWER_WITHIN: Duration = Duration::from_secs(3);
/// Slack on top of a model's stall timeout for a stalled stream's error frame.
pub const STALL_SLACK: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Expectation {
    /// A stable identifier for scripts.
    pub id: &'static str,
    /// The promise, in words.
    pub expectation: String,
    /// `None`: the drill could not check it (said why in `detail`); it does not fail the drill.
    pub holds: Option<bool>,
    /// The figures behind the verdict.
    pub detail: String,
}

impl Expectation {
    fn new(
        id: &'static str,
        expectation: impl Into<String>,
        holds: Option<bool>,
        detail: String,
    ) -> Self {
        Self { id, expectation: expectation.into(), holds, detail }
    }
}

/// Nearest-rank percentile of latencies, in milliseconds.
pub fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let pick = sorted[rank.clamp(1, sorted.len()) - 1];
    pick.as_secs_f64() * 1000.0
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// How the answers ended, for details: `200 by b ×38, 502 all_models_failed ×2`.
pub fn outcomes(observations: &[Observation]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for o in observations {
        let what = match (o.status, o.degraded) {
            (None, _) => format!("no answer ({})", o.error.as_deref().unwrap_or("?")),
            (Some(200), true) => "200 degraded".to_owned(),
            (Some(200), false) => match &o.stream {
                Some(s) if s.hung => "200, stream hung".to_owned(),
                Some(s) if s.error_code.is_some() => {
                    format!("200, stream ended by {}", s.error_code.as_deref().unwrap_or("?"))
                }
                _ => format!("200 by {}", o.served_model.as_deref().unwrap_or("?")),
            },
            (Some(status), _) => format!("{status} {}", o.error.as_deref().unwrap_or("")),
        };
        *counts.entry(what.trim().to_owned()).or_default() += 1;
    }
    counts.iter().map(|(what, n)| format!("{what} ×{n}")).collect::<Vec<_>>().join(", ")
}

/// `primary-down`: the chain's first model answers 503 to every call.
pub fn primary_down(
    obs: &[Observation],
    chain: &[String],
    window_size: u32,
    concurrency: usize,
    cooldown: Duration,
) -> Vec<Expectation> {
    let (primary, next) = (&chain[0], chain.get(1).unwrap_or(&chain[0]));
    // The first answer that found the breaker open: requests sent after it arrived must
    // not reach the primary; requests sent before it may have been in flight when it opened.
    let opened_seen = obs.iter().filter(|o| o.skipped(primary)).map(|o| o.finished).min();
    let mut found = Vec::new();
    match opened_seen {
        None => {
            let calls: u32 = obs.iter().map(|o| o.calls_to(primary)).sum();
            found.push(Expectation::new(
                "breaker_opened_within_one_window",
                "the primary's breaker opens within one window",
                Some(false),
                format!("it never opened: {calls} primary calls over {} requests", obs.len()),
            ));
            found.push(Expectation::new(
                "no_primary_call_once_open",
                "once open, no request calls the primary",
                None,
                "not checked: the breaker never opened".to_owned(),
            ));
        }
        Some(at) => {
            let before: u32 =
                obs.iter().filter(|o| o.started < at).map(|o| o.calls_to(primary)).sum();
            let in_flight = u32::try_from(concurrency.saturating_sub(1)).unwrap_or(u32::MAX);
            let bound = window_size.saturating_add(in_flight);
            found.push(Expectation::new(
                "breaker_opened_within_one_window",
                "the primary's breaker opens within one window",
                Some(before <= bound),
                format!(
                    "open after {before} primary calls, {} into the drill (window {window_size}, \
                     at most {in_flight} more in flight)",
                    ms(at)
                ),
            ));
            // Within its cool-down; after it, one request may be the half-open test (unless
            // the model is probed), which is the breaker working, not failing.
            let after: Vec<&Observation> =
                obs.iter().filter(|o| o.started >= at && o.started < at + cooldown).collect();
            let later = obs.iter().filter(|o| o.started >= at + cooldown).count();
            let calls: u32 = after.iter().map(|o| o.calls_to(primary)).sum();
            found.push(Expectation::new(
                "no_primary_call_once_open",
                "once open, no request calls the primary during its cool-down",
                Some(calls == 0 && !after.is_empty()),
                if after.is_empty() {
                    "no request was sent after it opened: raise --requests".to_owned()
                } else {
                    let later = if later > 0 {
                        format!(" ({later} more after the cool-down, not judged)")
                    } else {
                        String::new()
                    };
                    format!(
                        "{} requests sent after it opened made {calls} primary calls{later}",
                        after.len()
                    )
                },
            ));
        }
    }
    let by_next =
        obs.iter().filter(|o| o.served() && o.served_model.as_deref() == Some(next)).count();
    found.push(Expectation::new(
        "served_by_the_next_model",
        format!("every request is served by the next model ({next})"),
        Some(by_next == obs.len()),
        format!("{by_next} of {}: {}", obs.len(), outcomes(obs)),
    ));
    found
}

/// `primary-flaky`: half of the primary's calls answer 503.
pub fn primary_flaky(
    obs: &[Observation],
    transitions: u64,
    took: Duration,
    cooldown_ms: u64,
) -> Vec<Expectation> {
    let served = obs.iter().filter(|o| o.served()).count();
    // A breaker that is not flapping changes state at most three times per cool-down
    // (closed → open → half-open → closed or open): more means it reopens without waiting.
    let periods = 1 + took.as_millis() / u128::from(cooldown_ms.max(1));
    let bound = u64::try_from(3 * periods).unwrap_or(u64::MAX);
    vec![
        Expectation::new(
            "every_request_served",
            "every request is served",
            Some(served == obs.len()),
            format!("{served} of {}: {}", obs.len(), outcomes(obs)),
        ),
        Expectation::new(
            "no_flapping",
            "the primary's breaker does not flap",
            Some(transitions <= bound),
            format!(
                "{transitions} state changes in {} (at most {bound} with a cool-down of {cooldown_ms} ms)",
                ms(took)
            ),
        ),
    ]
}

/// `stream-stall`: the primary's streams stop after a few content chunks.
pub fn stream_stall(obs: &[Observation], stall_timeout: Duration) -> Vec<Expectation> {
    let streams: Vec<_> = obs.iter().filter_map(|o| o.stream.as_ref().map(|s| (o, s))).collect();
    let framed: Vec<_> =
        streams.iter().filter(|(_, s)| s.error_code.is_some() && !s.hung).collect();
    let hung = streams.iter().filter(|(_, s)| s.hung).count();
    let mut gaps: Vec<Duration> = framed
        .iter()
        .filter_map(|(_, s)| Some(s.error_at?.saturating_sub(s.last_content.unwrap_or_default())))
        .collect();
    gaps.sort();
    let limit = stall_timeout + STALL_SLACK;
    let worst = gaps.last().copied();
    vec![
        Expectation::new(
            "every_stream_ends_with_an_error_frame",
            "every stalled stream ends with an error frame; none hangs",
            Some(framed.len() == obs.len()),
            format!("{} of {} ({hung} hung): {}", framed.len(), obs.len(), outcomes(obs)),
        ),
        Expectation::new(
            "error_frame_within_stall_timeout",
            format!("the error frame comes within the stall timeout + 1 s ({})", ms(limit)),
            if gaps.is_empty() { None } else { Some(worst.is_some_and(|w| w <= limit)) },
            match worst {
                None => "not checked: no error frame arrived".to_owned(),
                Some(w) => format!(
                    "from the last content chunk to the error frame: p50 {:.0} ms, max {}",
                    percentile_ms(&gaps, 50.0),
                    ms(w)
                ),
            },
        ),
    ]
}

/// What the drill's healthy streams, sent before the fault, answered: the text every cut
/// stream must come to, or why there is none to compare with.
#[derive(Clone, Debug, PartialEq)]
pub enum Reference {
    Text(String),
    /// Two healthy streams of the same request differed (a model that does not answer the
    /// same way twice): a byte comparison would judge the model, not the continuation.
    NotJudged(String),
}

/// `stream-cut`: the primary's streams drop after a few content chunks, and the node
/// continues each one.
pub fn stream_cut(obs: &[Observation], reference: &Reference) -> Vec<Expectation> {
    let streams: Vec<_> = obs.iter().map(|o| (o, o.stream.as_ref())).collect();
    let complete = streams
        .iter()
        .filter(|(o, s)| {
            o.status == Some(200)
                && o.error.is_none()
                && s.is_some_and(|s| s.done && s.error_code.is_none() && !s.hung)
        })
        .count();
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for (_, s) in &streams {
        *counts.entry(s.map_or(0, |s| s.continuations)).or_default() += 1;
    }
    let once = counts.get(&1).copied().unwrap_or(0);
    let counted = counts
        .iter()
        .map(|(n, streams)| format!("{n} continuation(s) ×{streams}"))
        .collect::<Vec<_>>()
        .join(", ");
    let whole = match reference {
        Reference::NotJudged(why) => Expectation::new(
            "text_equals_a_healthy_stream",
            "every stream's text equals a healthy stream's, byte for byte",
            None,
            format!("not judged: {why}"),
        ),
        Reference::Text(text) => {
            let equal = streams.iter().filter(|(_, s)| s.is_some_and(|s| s.text == *text)).count();
            let first_bad = streams.iter().filter_map(|(_, s)| *s).find(|s| s.text != *text);
            let mut detail = format!("{equal} of {} equal the {} bytes", obs.len(), text.len());
            if let Some(bad) = first_bad {
                let at = bad.text.bytes().zip(text.bytes()).take_while(|(a, b)| a == b).count();
                detail.push_str(&format!(
                    "; the first that differs has {} bytes and parts from it at byte {at}",
                    bad.text.len()
                ));
            }
            Expectation::new(
                "text_equals_a_healthy_stream",
                "every stream's text equals a healthy stream's, byte for byte",
                Some(equal == obs.len()),
                detail,
            )
        }
    };
    vec![
        Expectation::new(
            "every_stream_ends_complete",
            "every cut stream ends with [DONE] and no error frame",
            Some(complete == obs.len()),
            format!("{complete} of {}: {}", obs.len(), outcomes(obs)),
        ),
        Expectation::new(
            "one_continuation_each",
            "every stream's final chunk reports exactly one continuation",
            Some(once == obs.len()),
            format!("{once} of {}: {counted}", obs.len()),
        ),
        whole,
    ]
}

/// An answer the all-down scenario accepts: the designed degraded answer, or the chain's
/// own `all_models_failed` (429 or 502).
fn all_down_answer(o: &Observation) -> bool {
    match o.status {
        Some(200) => o.degraded,
        Some(429 | 502) => o.error.as_deref() == Some("all_models_failed"),
        _ => false,
    }
}

/// `all-down`: every model of the chain answers 503; `outside` is a model outside the chain
/// and what requests to it came to during the drill.
pub fn all_down(obs: &[Observation], outside: Option<(&str, &[Observation])>) -> Vec<Expectation> {
    let fast =
        obs.iter().filter(|o| all_down_answer(o) && o.latency() <= ALL_DOWN_ANSWER_WITHIN).count();
    let latencies: Vec<Duration> = obs.iter().map(Observation::latency).collect();
    let slowest = latencies.iter().max().copied().unwrap_or_default();
    let degraded = obs.iter().filter(|o| o.degraded).count();
    let mut found = vec![Expectation::new(
        "answered_within_3s",
        "every request gets a degraded answer or all_models_failed within 3 s",
        Some(fast == obs.len()),
        format!(
            "{fast} of {} (slowest {}, {degraded} degraded): {}",
            obs.len(),
            ms(slowest),
            outcomes(obs)
        ),
    )];
    found.push(match outside {
        None => Expectation::new(
            "a_model_outside_the_chain_serves",
            "a model outside the chain keeps serving",
            None,
            "not checked: the key may use no model outside the chain that served before the drill"
                .to_owned(),
        ),
        Some((model, answers)) => {
            let served = answers
                .iter()
                .filter(|o| o.served() && o.served_model.as_deref() == Some(model))
                .count();
            Expectation::new(
                "a_model_outside_the_chain_serves",
                format!("a model outside the chain ({model}) keeps serving"),
                Some(served == answers.len() && !answers.is_empty()),
                format!("{served} of {}: {}", answers.len(), outcomes(answers)),
            )
        }
    });
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drill::observe::{Attempt, StreamTiming};

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn attempt(model: &str, status: &str) -> Attempt {
        Attempt {
            model: model.into(),
            status: status.into(),
            reason: None,
            retries: 0,
            injected: None,
        }
    }

    /// A request sent at `start` ms, answered 1 ms later, with these attempts.
    fn request(start: u64, attempts: &[(&str, &str)]) -> Observation {
        let served = attempts.iter().find(|(_, s)| *s == "served").map(|(m, _)| m.to_string());
        Observation {
            started: at(start),
            finished: at(start + 1),
            status: Some(if served.is_some() { 200 } else { 502 }),
            error: served.is_none().then(|| "all_models_failed".to_owned()),
            served_model: served,
            degraded: false,
            attempts: attempts.iter().map(|(m, s)| attempt(m, s)).collect(),
            stream: None,
        }
    }

    const COOL: Duration = Duration::from_secs(30);

    fn chain() -> Vec<String> {
        vec!["a".into(), "b".into()]
    }

    fn holds(found: &[Expectation]) -> Vec<Option<bool>> {
        found.iter().map(|e| e.holds).collect()
    }

    #[test]
    fn primary_down_holds_when_the_breaker_opens_and_the_next_model_serves_the_rest() {
        let mut obs: Vec<_> =
            (0..10).map(|i| request(i * 2, &[("a", "failed"), ("b", "served")])).collect();
        obs.extend((10..20).map(|i| request(i * 2, &[("a", "skipped"), ("b", "served")])));
        let found = primary_down(&obs, &chain(), 10, 1, COOL);
        assert_eq!(holds(&found), [Some(true), Some(true), Some(true)], "{found:#?}");
        assert!(found[0].detail.starts_with("open after 10 primary calls"), "{}", found[0].detail);
    }

    #[test]
    fn primary_down_fails_when_the_breaker_never_opens_or_a_later_request_calls_the_primary() {
        let obs: Vec<_> =
            (0..5).map(|i| request(i * 2, &[("a", "failed"), ("b", "served")])).collect();
        assert_eq!(
            holds(&primary_down(&obs, &chain(), 10, 1, COOL)),
            [Some(false), None, Some(true)]
        );

        let mut obs = vec![request(0, &[("a", "failed"), ("b", "served")])];
        obs.push(request(2, &[("a", "skipped"), ("b", "served")]));
        // Sent after the skip was seen, yet it called the primary (a half-open test subject).
        obs.push(request(4, &[("a", "failed"), ("b", "served")]));
        assert_eq!(holds(&primary_down(&obs, &chain(), 10, 1, COOL))[1], Some(false));
    }

    #[test]
    fn primary_down_does_not_judge_the_half_open_test_after_the_cool_down() {
        let mut obs = vec![request(0, &[("a", "failed"), ("b", "served")])];
        obs.push(request(2, &[("a", "skipped"), ("b", "served")]));
        obs.push(request(10, &[("a", "skipped"), ("b", "served")]));
        // 30 s after the breaker opened, a request is its half-open test.
        obs.push(request(30_010, &[("a", "served")]));
        let found = primary_down(&obs, &chain(), 10, 1, COOL);
        assert_eq!(found[1].holds, Some(true), "{found:#?}");
        assert!(found[1].detail.contains("1 more after the cool-down"), "{}", found[1].detail);
    }

    #[test]
    fn primary_down_allows_requests_in_flight_when_the_breaker_opened() {
        // 12 calls before the first skip was seen: more than the window of 10, within 10 + 3
        // in flight at concurrency 4, not within 10 at concurrency 1.
        let mut obs: Vec<_> =
            (0..12).map(|i| request(i, &[("a", "failed"), ("b", "served")])).collect();
        obs.push(request(20, &[("a", "skipped"), ("b", "served")]));
        assert_eq!(primary_down(&obs, &chain(), 10, 4, COOL)[0].holds, Some(true));
        assert_eq!(primary_down(&obs, &chain(), 10, 1, COOL)[0].holds, Some(false));
    }

    #[test]
    fn primary_down_fails_when_a_request_is_not_served_by_the_next_model() {
        let obs = vec![request(0, &[("a", "failed"), ("b", "failed")])];
        let found = primary_down(&obs, &chain(), 10, 1, COOL);
        assert_eq!(found[2].holds, Some(false));
        assert!(found[2].detail.contains("502 all_models_failed ×1"), "{}", found[2].detail);
    }

    #[test]
    fn primary_flaky_counts_served_requests_and_bounds_transitions_by_the_cooldown() {
        let obs =
            vec![request(0, &[("a", "failed"), ("b", "served")]), request(1, &[("a", "served")])];
        let took = Duration::from_millis(500);
        assert_eq!(holds(&primary_flaky(&obs, 3, took, 1000)), [Some(true), Some(true)]);
        assert_eq!(holds(&primary_flaky(&obs, 4, took, 1000)), [Some(true), Some(false)]);
        // Over 2.5 cool-downs, three cycles may happen.
        assert_eq!(primary_flaky(&obs, 9, Duration::from_millis(2500), 1000)[1].holds, Some(true));
        let failed = vec![request(0, &[("a", "failed"), ("b", "failed")])];
        assert_eq!(primary_flaky(&failed, 0, took, 1000)[0].holds, Some(false));
    }

    fn stream(last_content: u64, error_at: Option<u64>, hung: bool) -> Observation {
        let mut o = request(0, &[("a", "served")]);
        o.stream = Some(StreamTiming {
            content_chunks: 3,
            last_content: Some(at(last_content)),
            error_code: error_at.map(|_| "stream_stalled".to_owned()),
            error_at: error_at.map(at),
            done: false,
            hung,
            ..StreamTiming::default()
        });
        o
    }

    #[test]
    fn stream_stall_needs_an_error_frame_on_every_stream_within_the_timeout_plus_a_second() {
        let stall = Duration::from_millis(1000);
        let good = vec![stream(10, Some(1010), false), stream(10, Some(1900), false)];
        assert_eq!(holds(&stream_stall(&good, stall)), [Some(true), Some(true)]);
        let late = vec![stream(10, Some(2100), false)];
        assert_eq!(holds(&stream_stall(&late, stall)), [Some(true), Some(false)]);
        let hung = vec![stream(10, Some(1010), false), stream(10, None, true)];
        assert_eq!(holds(&stream_stall(&hung, stall)), [Some(false), Some(true)]);
        assert_eq!(holds(&stream_stall(&[stream(10, None, true)], stall)), [Some(false), None]);
    }

    /// A stream that ended with `[DONE]`, this text and this many continuations.
    fn cut(text: &str, continuations: usize) -> Observation {
        let mut o = request(0, &[("a", "served")]);
        o.stream = Some(StreamTiming {
            content_chunks: 3,
            done: true,
            text: text.to_owned(),
            continuations,
            ..StreamTiming::default()
        });
        o
    }

    #[test]
    fn stream_cut_holds_when_every_stream_ends_whole_with_one_continuation() {
        let reference = Reference::Text("Hello from a.".to_owned());
        let obs = vec![cut("Hello from a.", 1), cut("Hello from a.", 1)];
        let found = stream_cut(&obs, &reference);
        assert_eq!(holds(&found), [Some(true), Some(true), Some(true)], "{found:#?}");
        assert_eq!(found[2].detail, "2 of 2 equal the 13 bytes");
    }

    #[test]
    fn stream_cut_fails_an_error_frame_a_second_continuation_or_a_text_that_differs() {
        let reference = Reference::Text("Hello from a.".to_owned());
        let mut framed = cut("Hello", 1);
        if let Some(s) = framed.stream.as_mut() {
            s.done = false;
            s.error_code = Some("upstream_disconnected".to_owned());
        }
        let found = stream_cut(&[cut("Hello from a.", 1), framed], &reference);
        assert_eq!(holds(&found), [Some(false), Some(true), Some(false)], "{found:#?}");
        assert!(found[2].detail.ends_with("parts from it at byte 5"), "{}", found[2].detail);

        let twice = stream_cut(&[cut("Hello from a.", 2), cut("Hello from a.", 0)], &reference);
        assert_eq!(holds(&twice), [Some(true), Some(false), Some(true)]);
        assert_eq!(twice[1].detail, "0 of 2: 0 continuation(s) ×1, 2 continuation(s) ×1");

        // A spliced answer: the whole answer again after the cut.
        let spliced = stream_cut(&[cut("Hello frHello from a.", 1)], &reference);
        assert_eq!(spliced[2].holds, Some(false));
    }

    #[test]
    fn stream_cut_does_not_judge_the_text_when_healthy_streams_differ() {
        let reference = Reference::NotJudged("two healthy streams differ".to_owned());
        let found = stream_cut(&[cut("anything", 1)], &reference);
        assert_eq!(holds(&found), [Some(true), Some(true), None]);
        assert_eq!(found[2].detail, "not judged: two healthy streams differ");
    }

    #[test]
    fn all_down_wants_fast_failures_or_degraded_answers_and_a_model_outside_serving() {
        let failed = request(0, &[("a", "failed"), ("b", "failed")]);
        let outside = request(0, &[("c", "served")]);
        let found =
            all_down(std::slice::from_ref(&failed), Some(("c", std::slice::from_ref(&outside))));
        assert_eq!(holds(&found), [Some(true), Some(true)]);

        let mut slow = failed.clone();
        slow.finished = at(3500);
        assert_eq!(all_down(&[slow], None)[0].holds, Some(false));
        // A 200 from a chain model means the faults did not take.
        let served = request(0, &[("a", "served")]);
        assert_eq!(all_down(&[served], None)[0].holds, Some(false));
        let mut degraded = request(0, &[("a", "failed")]);
        degraded.status = Some(200);
        degraded.degraded = true;
        assert_eq!(all_down(&[degraded], None)[0].holds, Some(true));

        assert_eq!(all_down(std::slice::from_ref(&failed), None)[1].holds, None);
        let down = request(0, &[("c", "failed")]);
        assert_eq!(all_down(&[failed], Some(("c", &[down])))[1].holds, Some(false));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<_> = (1..=100).map(at).collect();
        assert_eq!(percentile_ms(&samples, 50.0), 50.0);
        assert_eq!(percentile_ms(&samples, 99.0), 99.0);
        assert_eq!(percentile_ms(&[], 99.0), 0.0);
    }
}
