//! `load_shed`: the service answered 503 (without an OOM) to part of the load: it refused
//! work it judged it could not do in time or in memory, so the load the user asked for was
//! not what it served.
//!
//! Design note: shedding is the service's own decision, so the finding reports its reason
//! when the service says one (`vramroom serve`'s `vramroom_admission_rejections_total` by
//! reason, scraped from `--metrics-url`, and any `Retry-After` on the answers), and the
//! memory it stood at, so "shed while memory was at 3% of the capacity" reads as what it is:
//! a latency or queue limit, not memory. Severity by the share shed: most of the load shed
//! (the run measured the refusal, not the model) is critical.
use super::rules::nums;
use crate::results::*;

/// Share of the requests shed at which the finding is a warning, and critical.
const WARNING_SHARE: f64 = 0.01;
const CRITICAL_SHARE: f64 = 0.5;

pub(super) fn load_shed(r: &RunResult) -> Option<Finding> {
    let h = r.http.as_ref()?;
    let sent = r.requests.total + h.shed;
    if h.shed == 0 || sent == 0 {
        return None;
    }
    let share = h.shed as f64 / sent as f64;
    let severity = if share >= CRITICAL_SHARE {
        Severity::Critical
    } else if share >= WARNING_SHARE {
        Severity::Warning
    } else {
        Severity::Info
    };
    let top = h.shed_reasons.iter().max_by_key(|(_, n)| **n);
    let reasons = if h.shed_reasons.is_empty() {
        "The service did not say why (no admission metrics scraped: pass --metrics-url)".to_string()
    } else {
        format!(
            "The service says why: {}",
            h.shed_reasons
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let retry = match (h.retry_after_answers, h.retry_after_max_s) {
        (0, _) => String::new(),
        (n, Some(s)) => format!("; {n} answers asked to retry after up to {s} s"),
        (n, None) => format!("; {n} answers carried Retry-After"),
    };
    let memory = if r.capacity_bytes > 0 && r.peaks.reserved_bytes > 0 {
        format!(
            ", while reserved memory peaked at {:.0}% of the capacity",
            100.0 * r.peaks.reserved_bytes as f64 / r.capacity_bytes as f64
        )
    } else {
        String::new()
    };
    let fix = match top.map(|(k, _)| k.as_str()) {
        Some("queue_delay") => "The service's latency admission shed it: requests were \
             predicted to wait past their latency target. Lower the load, add compute workers \
             (`vramroom serve --workers`), or allow more latency (`--max-latency 200ms`, or \
             `off`)."
            .to_string(),
        Some("memory") => "The service's memory admission shed it: the predicted peaks of the \
             admitted work filled the capacity less the margin. Lower the load or the input \
             sizes, or give the service more memory (`--capacity`, a smaller `--margin`)."
            .to_string(),
        Some("queue_full") => "The service's queue was full (`--max-queue`): lower the load or \
             raise the queue bound."
            .to_string(),
        Some(other) => format!("The service shed load for `{other}`: see its documentation."),
        None => "Lower the load to what the service admits, or raise the service's admission \
             limits; scrape its metrics (--metrics-url) to learn why it sheds."
            .to_string(),
    };
    let mut numbers = nums(&[
        ("shed_requests", h.shed as f64),
        ("shed_share", share),
        ("retry_after_answers", h.retry_after_answers as f64),
    ]);
    for (k, n) in &h.shed_reasons {
        numbers.insert(format!("shed_{k}"), *n as f64);
    }
    Some(Finding {
        id: FindingId::LoadShed,
        title: "The service shed part of the load (503)".into(),
        severity,
        evidence: format!(
            "{} of {sent} requests ({:.2}%) were answered 503 without an OOM{memory}. \
             {reasons}{retry}.",
            h.shed,
            100.0 * share
        ),
        numbers,
        fix,
        predicted_saving_bytes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testdata::synthetic_http;

    #[test]
    fn most_of_the_load_shed_for_queue_delay_is_critical_and_says_why() {
        let mut r = synthetic_http(false);
        let h = r.http.as_mut().unwrap();
        h.shed = 9995;
        h.shed_reasons = [("queue_delay".to_string(), 9995u64)].into_iter().collect();
        h.retry_after_answers = 9995;
        h.retry_after_max_s = Some(1);
        r.requests.total = 5;
        let f = load_shed(&r).expect("a finding");
        assert_eq!(f.severity, Severity::Critical);
        assert!(f.evidence.contains("queue_delay 9995"), "{}", f.evidence);
        assert!(
            f.evidence.contains("retry after up to 1 s"),
            "{}",
            f.evidence
        );
        assert!(f.fix.contains("--max-latency"), "{}", f.fix);
    }

    #[test]
    fn no_shed_no_finding_and_a_little_is_info() {
        let mut r = synthetic_http(false);
        r.http.as_mut().unwrap().shed = 0;
        assert!(load_shed(&r).is_none());
        let h = r.http.as_mut().unwrap();
        h.shed = 1;
        h.shed_reasons.clear();
        r.requests.total = 1000;
        let f = load_shed(&r).expect("a finding");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.evidence.contains("did not say why"), "{}", f.evidence);
    }
}
