//! Summary statistics and how the tables print them.

/// The median of the finite values.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 })
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

/// A figure with `decimals` decimals, or a dash where there is none.
pub fn fmt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.decimals$}"))
}

/// Nearest-rank percentile of unsorted values.
pub fn pct(v: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// The sum of a counter over all its label sets, from Prometheus text.
pub fn sum_metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The sum of a metric's samples whose label sets include every one of `labels`, from
/// Prometheus text (a gauge's value when they name one series).
pub fn sum_labelled(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.split_once('}'))
        .filter(|(set, _)| {
            labels.iter().all(|(k, v)| set.split(',').any(|kv| kv == format!("{k}=\"{v}\"")))
        })
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sum_metric_adds_every_label_set_of_one_counter_only() {
        let text = "# TYPE switchyard_upstream_retries counter\n\
                    switchyard_upstream_retries_total{model=\"a\"} 3\n\
                    switchyard_upstream_retries_total{model=\"b\"} 4\n\
                    switchyard_upstream_retries_totalx 100\n";
        assert_eq!(super::sum_metric(text, "switchyard_upstream_retries_total"), 7);
        assert_eq!(super::sum_metric(text, "switchyard_retry_budget_refusals_total"), 0);
    }

    #[test]
    fn sum_labelled_adds_the_series_that_carry_every_label() {
        let text = "# TYPE switchyard_probes counter\n\
                    switchyard_probes_total{provider=\"sim\",upstream_model=\"dying-1\",outcome=\"failure\"} 3\n\
                    switchyard_probes_total{provider=\"sim\",upstream_model=\"dying-1\",outcome=\"success\"} 1\n\
                    switchyard_probes_total{provider=\"sim\",upstream_model=\"dying-10\",outcome=\"failure\"} 50\n\
                    switchyard_probes_total_x{provider=\"sim\",upstream_model=\"dying-1\"} 70\n";
        let dying_1 = [("provider", "sim"), ("upstream_model", "dying-1")];
        assert_eq!(super::sum_labelled(text, "switchyard_probes_total", &dying_1), 4.0);
        assert_eq!(
            super::sum_labelled(text, "switchyard_probes_total", &[("upstream_model", "dying-2")]),
            0.0
        );
    }
}
