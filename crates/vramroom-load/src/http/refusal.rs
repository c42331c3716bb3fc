//! An HTTP run that only measures a refusal: every answer the same 4xx (405 from a GET
//! against `vramroom serve`'s POST endpoint, 404 from a wrong path, 422 from a wrong body).
//!
//! Design note: such a run would hammer the service for its whole duration and then report
//! latencies of the refusal, which is never what the user wanted, so the controller stops
//! it once enough answers agree ([`Refusals::stop_status`]) and the result carries a hint
//! in words ([`hint`]) of what to change. 408 and 429 are left out: they say the service is
//! slow or limiting the rate, which is what a load test is for.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Answers that must agree before the run stops: enough that a service warming up (a 404
/// before its route is registered) is not mistaken for one that refuses every request.
pub const MIN_ANSWERS: u64 = 50;

/// The statuses of a run's answers, as far as "all the same 4xx" goes.
#[derive(Debug, Default)]
pub struct Refusals {
    /// The first answer's status (0 before any).
    first: AtomicU32,
    /// An answer that was not `first`, or not a refusal.
    mixed: AtomicBool,
    answers: AtomicU64,
}

/// A status that refuses the request itself (a 4xx other than 408 and 429).
fn refuses(status: u16) -> bool {
    (400..500).contains(&status) && status != 408 && status != 429
}

impl Refusals {
    /// Counts one answer.
    pub fn see(&self, status: u16) {
        self.answers.fetch_add(1, Ordering::Relaxed);
        if !refuses(status) {
            self.mixed.store(true, Ordering::Relaxed);
            return;
        }
        let first = match self.first.compare_exchange(
            0,
            u32::from(status),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => u32::from(status),
            Err(f) => f,
        };
        if first != u32::from(status) {
            self.mixed.store(true, Ordering::Relaxed);
        }
    }

    /// The status every answer so far was, once at least [`MIN_ANSWERS`] came back.
    pub fn stop_status(&self) -> Option<u16> {
        if self.mixed.load(Ordering::Relaxed) || self.answers.load(Ordering::Relaxed) < MIN_ANSWERS
        {
            return None;
        }
        u16::try_from(self.first.load(Ordering::Relaxed))
            .ok()
            .filter(|&s| refuses(s))
    }
}

/// What to change when every answer was `status` to requests sent with `method`.
pub fn hint(status: u16, method: &str, url: &str) -> String {
    let what = match status {
        405 => format!(
            "405 Method Not Allowed: {url} does not take {method}. `vramroom serve` takes \
             POST with a JSON body, e.g. -m POST -d '{{\"inputs\": {{{{rand_ints 16..64 0 \
             50256}}}}}}'"
        ),
        404 => format!("404 Not Found: no such path on the service ({url}); check the URL"),
        400 | 422 => format!(
            "{status}: the service rejects the request body; check -d, --body-file or \
             --body-dir against what the endpoint expects (and -H 'Content-Type: \
             application/json' for JSON)"
        ),
        415 => "415 Unsupported Media Type: add the header the endpoint expects, e.g. -H \
                'Content-Type: application/json'"
            .to_string(),
        401 | 403 => format!(
            "{status}: the service refuses the credentials; add them, e.g. -H \
             'Authorization: Bearer TOKEN'"
        ),
        413 => "413 Content Too Large: the bodies are over the service's limit; make them \
                smaller (--body-size, -d)"
            .to_string(),
        s => format!("{s}: the service refuses the request itself"),
    };
    format!(
        "every answer was {what}. The run stopped after {MIN_ANSWERS} of them: the load \
         measured nothing but the refusal"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_the_same_refusal_stops_after_enough_answers() {
        let r = Refusals::default();
        for _ in 0..MIN_ANSWERS - 1 {
            r.see(405);
        }
        assert_eq!(r.stop_status(), None, "not yet enough answers");
        r.see(405);
        assert_eq!(r.stop_status(), Some(405));
    }

    #[test]
    fn one_other_answer_or_a_load_status_never_stops() {
        let r = Refusals::default();
        r.see(404);
        r.see(200);
        for _ in 0..MIN_ANSWERS {
            r.see(404);
        }
        assert_eq!(r.stop_status(), None);
        for s in [429, 408, 503] {
            let r = Refusals::default();
            for _ in 0..MIN_ANSWERS * 2 {
                r.see(s);
            }
            assert_eq!(r.stop_status(), None, "{s}");
        }
        let r = Refusals::default();
        for i in 0..MIN_ANSWERS * 2 {
            r.see(if i % 2 == 0 { 404 } else { 405 });
        }
        assert_eq!(r.stop_status(), None);
    }

    #[test]
    fn the_hint_names_the_fix() {
        let h = hint(405, "GET", "http://127.0.0.1:8000/v1/predict");
        assert!(
            h.contains("does not take GET") && h.contains("-m POST"),
            "{h}"
        );
        assert!(hint(404, "POST", "http://x/y").contains("check the URL"));
        assert!(hint(422, "POST", "http://x/y").contains("-d"));
    }
}
