//! The Kubernetes manifests in deploy/kubernetes against the binary they run: every
//! `switchyard` container passes arguments the binary accepts, and gives its drain the time
//! it needs before the kubelet kills the pod. (deploy/validate checks them against the
//! Kubernetes schemas.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_yaml_ng::Value;

use switchyard_e2e::switchyard_bin;

/// Every pod template of the manifests: (file, workload name, pod spec).
fn pod_specs() -> Vec<(String, String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let mut specs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.extension().is_none_or(|e| e != "yaml") || name == "kustomization.yaml" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let resource = Value::deserialize(document).unwrap();
            let spec = &resource["spec"]["template"]["spec"];
            if !spec.is_null() {
                let workload = resource["metadata"]["name"].as_str().unwrap().to_owned();
                specs.push((name.clone(), workload, spec.clone()));
            }
        }
    }
    assert!(!specs.is_empty(), "no pod templates in {}", dir.display());
    specs
}

/// The `switchyard` containers of a pod spec, with their arguments.
fn switchyard_containers(spec: &Value) -> Vec<(Value, Vec<String>)> {
    spec["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|c| c["image"].as_str().is_some_and(|i| i.starts_with("switchyard")))
        .map(|c| {
            let args = c["args"].as_sequence().unwrap().iter();
            (c.clone(), args.map(|a| a.as_str().unwrap().to_owned()).collect())
        })
        .collect()
}

/// `--drain-timeout=30s` (or `10s`, `2m`) among the arguments.
fn drain_timeout(args: &[String]) -> Option<Duration> {
    let value = args.iter().find_map(|a| a.strip_prefix("--drain-timeout="))?;
    let (number, unit) = value.split_at(value.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = number.parse().ok()?;
    match unit {
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n * 60)),
        _ => panic!("--drain-timeout={value}: write it in s or m here"),
    }
}

#[test]
fn every_switchyard_container_passes_arguments_the_binary_accepts() {
    let mut checked = 0;
    for (file, workload, spec) in pod_specs() {
        for (_, args) in switchyard_containers(&spec) {
            // Parsing stops at a trailing `--help`, after every argument before it has been
            // read: an unknown flag or a bad value fails as it would at start.
            let out = std::process::Command::new(switchyard_bin())
                .args(&args)
                .arg("--help")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{file}, {workload}: `switchyard {}` is refused:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 2, "the control plane and the node are both in the manifests");
}

#[test]
fn every_switchyard_pod_outlasts_its_drain_before_it_is_killed() {
    for (file, workload, spec) in pod_specs() {
        for (container, args) in switchyard_containers(&spec) {
            let drain = drain_timeout(&args).unwrap_or_else(|| {
                panic!("{file}, {workload}: say --drain-timeout, so the grace period can match it")
            });
            let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
            let pre_stop =
                container["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64().unwrap_or(0);
            // A node hands its failover events over after the drain, for at least 2 s.
            let needed = pre_stop + drain.as_secs() + 2;
            assert!(
                grace > needed,
                "{file}, {workload}: terminationGracePeriodSeconds {grace} must exceed the preStop \
                 pause ({pre_stop} s) + --drain-timeout ({} s) + the 2 s hand-off",
                drain.as_secs()
            );
        }
    }
}

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn yaml(path: &str) -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(repo(path)).unwrap()).unwrap()
}

/// The alerts of deploy/prometheus/alerts.yaml, by name.
fn alert_names() -> Vec<String> {
    yaml("deploy/prometheus/alerts.yaml")["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().iter())
        .map(|r| r["alert"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_alert_rules_pass_promtool_with_a_case_each_way_for_every_alert() {
    // Every alert has a test that expects it to fire and one that expects it silent.
    let tests = yaml("deploy/prometheus/alerts_test.yaml");
    let cases: Vec<&Value> = tests["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_sequence().unwrap().iter())
        .collect();
    let alerts = alert_names();
    assert_eq!(alerts.len(), 9, "{alerts:?}");
    for alert in &alerts {
        let expected = |fires: bool| {
            cases.iter().any(|c| {
                c["alertname"].as_str() == Some(alert.as_str())
                    && c["exp_alerts"].as_sequence().unwrap().is_empty() != fires
            })
        };
        assert!(expected(true), "no case of alerts_test.yaml expects {alert} to fire");
        assert!(expected(false), "no case of alerts_test.yaml expects {alert} to stay silent");
    }

    // `check rules` with its lints fatal refuses what `test rules` lets pass (two rules of
    // one name and labels); `test rules` then runs each case.
    let commands: [(&[&str], &str); 2] = [
        (&["check", "rules", "--lint=all", "--lint-fatal"], "deploy/prometheus/alerts.yaml"),
        (&["test", "rules"], "deploy/prometheus/alerts_test.yaml"),
    ];
    for (command, file) in commands {
        let out = std::process::Command::new("promtool")
            .args(command)
            .arg(repo(file))
            .output()
            .expect("promtool (Debian's prometheus package; .ci/run installs it)");
        assert!(
            out.status.success(),
            "promtool {} {file}:\n{}{}",
            command.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_alert_says_what_happened_what_to_do_and_links_its_runbook() {
    let docs = std::fs::read_to_string(repo("docs/operating.md")).unwrap();
    let rules = yaml("deploy/prometheus/alerts.yaml");
    let rules = rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().iter());
    for rule in rules {
        let alert = rule["alert"].as_str().unwrap();
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{alert}: severity {severity:?}, not critical or warning"
        );
        let annotation = |name: &str| rule["annotations"][name].as_str().unwrap_or_default();
        assert!(!annotation("summary").is_empty(), "{alert} has no summary");
        assert!(!annotation("description").is_empty(), "{alert} has no description");
        // A path relative to the repository, to the alert's heading: GitHub's anchor of
        // `#### SwitchyardFoo` is `#switchyardfoo`.
        let runbook = annotation("runbook_url");
        assert_eq!(
            runbook,
            format!("docs/operating.md#{}", alert.to_lowercase()),
            "{alert}'s runbook_url"
        );
        assert!(
            docs.lines().any(|l| l == format!("#### {alert}")),
            "docs/operating.md has no runbook section `#### {alert}` (under \"Alerts\")"
        );
    }
}

#[test]
fn the_prometheus_rule_component_carries_the_alert_rules_unchanged() {
    let rule = yaml("deploy/kubernetes/prometheus-rule/prometheusrule.yaml");
    assert_eq!(rule["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(rule["metadata"]["name"].as_str(), Some("switchyard"));
    let spec = rule["spec"].as_mapping().unwrap();
    assert_eq!(spec.len(), 1, "a PrometheusRule's spec holds only `groups`: {spec:?}");
    // No schema of deploy/validate's knows the Operator's kind: the fields its CRD gives a
    // group and a rule, and the string maps it wants, are held here instead (a field the
    // Operator does not know is dropped or refused by the API server).
    for group in rule["spec"]["groups"].as_sequence().unwrap() {
        for (field, _) in group.as_mapping().unwrap() {
            let field = field.as_str().unwrap();
            assert!(
                ["name", "interval", "rules", "limit", "labels", "query_offset"].contains(&field),
                "a PrometheusRule group has no field {field}"
            );
        }
        for r in group["rules"].as_sequence().unwrap() {
            for (field, value) in r.as_mapping().unwrap() {
                let field = field.as_str().unwrap();
                assert!(
                    ["alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"]
                        .contains(&field),
                    "a PrometheusRule rule has no field {field}"
                );
                if ["labels", "annotations"].contains(&field) {
                    for (k, v) in value.as_mapping().unwrap() {
                        assert!(v.is_string(), "{field}.{k:?} of {:?} is not a string", r["alert"]);
                    }
                }
            }
        }
    }
    assert_eq!(
        rule["spec"]["groups"],
        yaml("deploy/prometheus/alerts.yaml")["groups"],
        "prometheusrule.yaml's spec.groups differ from deploy/prometheus/alerts.yaml's groups: copy them over"
    );
    let component = yaml("deploy/kubernetes/prometheus-rule/kustomization.yaml");
    assert_eq!(component["kind"].as_str(), Some("Component"));
    assert_eq!(component["resources"][0].as_str(), Some("prometheusrule.yaml"));
    // The base must apply on a cluster without the Prometheus Operator's CRD.
    let base = std::fs::read_to_string(repo("deploy/kubernetes/kustomization.yaml")).unwrap();
    assert!(!base.contains("prometheus"), "the base pulls in the PrometheusRule:\n{base}");
}
