"""The chart's Grafana dashboard and Prometheus alerts: off by default, and they query only
metrics the operator exports."""
from __future__ import annotations

import json
import re

import pytest

from ddpjob_operator.controller import metrics
from tests.charts.promql import PromQLSyntaxError, grafana_query_names, metric_names
from tests.charts.support import CHART_DIR, KUBE_VERSIONS, by_kind, one, render, validate_k8s

DASHBOARD_FILE = CHART_DIR / "dashboards" / "ddpjob-operator.json"
BOTH_ON = {"metrics": {"enabled": True, "grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}}
# Series names each metric type exposes (the Prometheus text format; `_created` is prometheus_client's).
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"), "info": ("_info",)}


def exported_series() -> dict[str, str]:
    """{series name: metric family} of everything registered in the operator's registry."""
    return {family.name + suffix: family.name
            for family in metrics.REGISTRY.collect() for suffix in SUFFIXES[family.type]}


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, query) of every panel target and every variable query."""
    found = []
    panels = [p for row in dashboard["panels"] for p in [row, *row.get("panels", [])]]
    for panel in panels:
        found += [(f"panel {panel['title']!r} {t['refId']}", t["expr"]) for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append((f"variable {variable['name']}", query["query"] if isinstance(query, dict) else query))
    return found


def alert_rules(objects: list[dict]) -> list[dict]:
    return [rule for group in one(objects, "PrometheusRule")["spec"]["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("values", [
    {},
    {"metrics": {"enabled": True}},
    {"metrics": {"enabled": False, "grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}},
], ids=["defaults", "metrics-only", "metrics-off"])
def test_the_dashboard_and_the_alerts_are_rendered_only_when_enabled_with_metrics(values):
    objects = render(values)
    assert by_kind(objects, "ConfigMap") == [] and by_kind(objects, "PrometheusRule") == []


def test_each_option_renders_its_own_object():
    dashboard_only = render({"metrics": {"enabled": True, "grafanaDashboard": {"enabled": True}}})
    rules_only = render({"metrics": {"enabled": True, "prometheusRule": {"enabled": True}}})
    assert len(by_kind(dashboard_only, "ConfigMap")) == 1 and by_kind(dashboard_only, "PrometheusRule") == []
    assert len(by_kind(rules_only, "PrometheusRule")) == 1 and by_kind(rules_only, "ConfigMap") == []


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_the_dashboard_configmap_carries_the_sidecar_label_and_the_dashboard_file(version):
    values = {"metrics": {"enabled": True, "grafanaDashboard": {
        "enabled": True, "sidecarLabel": "grafana.example.com/dashboard", "sidecarLabelValue": "yes",
        "namespace": "monitoring", "annotations": {"grafana_folder": "Training"}}}}
    config_map = one(render(values), "ConfigMap")
    validate_k8s(config_map, version)
    assert config_map["metadata"]["labels"]["grafana.example.com/dashboard"] == "yes"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Training"}
    assert json.loads(config_map["data"]["ddpjob-operator.json"]) == json.loads(DASHBOARD_FILE.read_text())
    default = one(render(BOTH_ON), "ConfigMap")["metadata"]
    assert default["labels"]["grafana_dashboard"] == "1" and default["namespace"] == "ddpjob-system"


def test_every_metric_the_dashboard_queries_is_one_the_operator_exports():
    exported = exported_series()
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 15
    unknown = {f"{where}: {name}" for where, query in queries for name in grafana_query_names(query)
               if name not in exported}
    assert unknown == set()


def test_the_dashboard_shows_every_metric_the_operator_exports():
    """A metric added to the exporter and left off the dashboard is one nobody looks at."""
    queried = {name for _, query in dashboard_queries(json.loads(DASHBOARD_FILE.read_text()))
               for name in grafana_query_names(query)}
    families = exported_series()
    assert set(families.values()) - {families.get(name) for name in queried} == set()


def test_every_metric_the_alerts_query_is_one_the_operator_exports():
    exported = exported_series()
    rules = alert_rules(render(BOTH_ON))
    queried = {name: rule["alert"] for rule in rules for name in metric_names(rule["expr"])}
    assert {name: alert for name, alert in queried.items() if name not in exported} == {}
    # The alerts the brief names, each on the metric it needs.
    assert {"ddpjob_operator_job_phase", "ddpjob_operator_restart_budget_used", "ddpjob_operator_restart_budget_limit",
            "ddpjob_operator_step_advanced_timestamp_seconds", "ddpjob_operator_straggler_slowdown_ratio",
            "ddpjob_operator_reconcile_errors_total"} <= set(queried)


def test_the_alerts_values_yaml_lists_are_the_alerts_rendered():
    values_text = (CHART_DIR / "values.yaml").read_text()
    documented = re.search(r"# metrics\.prometheusRule\.enabled -- (.*?)\n\s+enabled:", values_text, re.S)[1]
    rendered = [rule["alert"] for rule in alert_rules(render(BOTH_ON))]
    assert sorted(set(re.findall(r"DDPJob\w+", documented))) == sorted(rendered)


def test_the_alert_thresholds_come_from_the_values():
    rules = {rule["alert"]: rule for rule in alert_rules(render({"metrics": {"enabled": True, "prometheusRule": {
        "enabled": True, "restartBudgetRatio": 0.5, "noProgressSeconds": 900, "stragglerSlowdown": 2.5,
        "stragglerFor": "5m", "restartingFor": "1h", "reconcileErrorRatio": 0.25, "labels": {"release": "kps"}}}}))}
    assert ">= 0.5 unless" in rules["DDPJobRestartBudgetNearlySpent"]["expr"]
    assert "> 900 and" in rules["DDPJobNoProgress"]["expr"]
    assert rules["DDPJobStraggler"]["expr"].endswith(">= 2.5") and rules["DDPJobStraggler"]["for"] == "5m"
    assert rules["DDPJobRestartingTooLong"]["for"] == "1h"
    assert rules["DDPJobOperatorReconcileErrors"]["expr"].endswith("> 0.25")


def test_alert_annotations_keep_prometheus_templates_for_prometheus():
    """Helm must not eat {{ $labels.x }}: Prometheus fills it in when the alert fires."""
    rules = {rule["alert"]: rule for rule in alert_rules(render(BOTH_ON))}
    assert "{{ $labels.namespace }}/{{ $labels.name }}" in rules["DDPJobFailed"]["annotations"]["summary"]
    assert "failurePolicy.{{ $labels.budget }}" in rules["DDPJobRestartBudgetNearlySpent"]["annotations"]["summary"]


@pytest.mark.parametrize(("expr", "names"), [
    ("sum by (le) (rate(a_bucket[$__rate_interval]))", {"a_bucket"}),
    ('x{phase=~"Failed|Restarting"} == 1 and on (namespace, name) y', {"x", "y"}),
    ("histogram_quantile(0.95, sum without (pod) (rate(h_bucket[5m] offset 1h)))", {"h_bucket"}),
    ("time() - t > 1.5e3 unless ignoring(node) group_left(name) z", {"t", "z"}),
    ('count_values("v", k:recorded:rate5m)', {"k:recorded:rate5m"}),
])
def test_the_tokenizer_finds_the_metric_names_and_nothing_else(expr, names):
    assert metric_names(expr) == names


@pytest.mark.parametrize(("expr", "message"), [
    ("rate(x[5m]) # comment", "cannot read '#' at 12"),
    ("sum(rate(x[5m])", "1 '(' never closed"),
    ('{__name__="x"}', "a __name__ matcher is not supported"),
])
def test_the_tokenizer_refuses_what_it_cannot_read(expr, message):
    with pytest.raises(PromQLSyntaxError, match=re.escape(message)):
        metric_names(expr)
