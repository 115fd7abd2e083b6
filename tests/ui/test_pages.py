"""What a person sees in the Prefect and MLflow UIs after a pipeline run, in a real browser.

The run is the deployed one the deployment test makes (``deployed_pipeline_run``): one pipeline
run for both. Screenshots land in test-outputs/ui/ (git-ignored).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.ui.conftest import screenshot

pytestmark = pytest.mark.slow


def artifacts_tab(page, ui_url: str, flow_run_id) -> None:
    """The flow run's page, on its Artifacts tab."""
    page.goto(f"{ui_url}/runs/flow-run/{flow_run_id}")
    page.locator("li.p-tab", has_text="Artifacts").click()


def artifact_card(page, key: str):
    """The card of artifact ``key`` on a flow run's Artifacts tab."""
    return page.locator(".artifact-card__title", has_text=re.compile(f"^{re.escape(key)}$"))


def open_artifact(page, ui_url: str, flow_run_id, key: str) -> None:
    """From the flow run's page, its Artifacts tab, then the artifact card named ``key``."""
    from playwright.sync_api import expect

    artifacts_tab(page, ui_url, flow_run_id)
    card = artifact_card(page, key)
    expect(card).to_be_visible()
    card.click()
    expect(page.get_by_text("Show raw data")).to_be_visible()


def test_the_flow_run_page_shows_the_summary_and_the_finished_training_progress(
    deployed_pipeline_run, page
):
    from playwright.sync_api import expect

    run = deployed_pipeline_run
    assert run.flow_run.state.is_completed(), run.flow_run.state
    artifacts_tab(page, run.ui_url, run.flow_run.id)
    expect(page.get_by_text("Completed").first).to_be_visible()
    for key in ("hvdflow-summary", "hvdflow-timings", "hvdflow-training-progress"):
        expect(artifact_card(page, key)).to_be_visible()
    screenshot(page, "prefect-flow-run-artifacts")

    open_artifact(page, run.ui_url, run.flow_run.id, "hvdflow-summary")
    expect(page.get_by_text("hvdflow pipeline run")).to_be_visible()
    expect(page.get_by_text("training throughput (steady state)")).to_be_visible()
    expect(page.get_by_text("wall clock incl. launch")).to_be_visible()
    # Links to the MLflow run and to the registered version.
    expect(page.locator(f"a[href^='{run.tracking_uri}/#/experiments/']")).to_have_count(1)
    expect(page.locator(f"a[href^='{run.tracking_uri}/#/models/']")).to_have_count(1)
    screenshot(page, "prefect-summary-artifact")

    open_artifact(page, run.ui_url, run.flow_run.id, "hvdflow-training-progress")
    expect(page.get_by_text("Progress: 100%")).to_be_visible()
    expect(page.get_by_text("finished")).to_be_visible()
    screenshot(page, "prefect-training-progress")


def test_the_mlflow_model_page_shows_champion_and_what_produced_the_version(
    deployed_pipeline_run, page
):
    from mlflow import MlflowClient
    from playwright.sync_api import expect

    from tests.deployments import MODEL

    run = deployed_pipeline_run
    client = MlflowClient(run.tracking_uri)
    version = client.get_model_version_by_alias(MODEL, "champion")
    experiment_id = client.get_run(version.run_id).info.experiment_id
    page.goto(f"{run.tracking_uri}/#/models/{MODEL}/versions/{version.version}")
    expect(page.get_by_text("champion").first).to_be_visible()
    expect(page.get_by_text("Trained by the hvdflow pipeline.")).to_be_visible()
    expect(page.get_by_text("dataset fingerprint", exact=False).first).to_be_visible()
    expect(page.get_by_text("engine: horovod")).to_be_visible()
    expect(page.get_by_role("link", name=str(run.flow_run.id))).to_have_attribute(
        "href", f"{run.ui_url}/runs/flow-run/{run.flow_run.id}"
    )
    screenshot(page, "mlflow-model-version")

    # The run's per-epoch metrics, charted by epoch.
    page.goto(
        f"{run.tracking_uri}/#/experiments/{experiment_id}/runs/{version.run_id}/model-metrics"
    )
    # Charts below the fold are drawn when scrolled to: the search box brings them up.
    page.get_by_placeholder("Search metric charts").fill("val_")
    for chart in ("val_accuracy", "val_loss"):
        expect(page.get_by_text(chart, exact=True).first).to_be_visible()
    expect(page.locator(".js-plotly-plot")).to_have_count(2)  # both drawn (plotly)
    screenshot(page, "mlflow-run-metrics")


# A flow that publishes PNG plots as the benchmark flow does
# (hvdflow.flows.prefect.benchmark.plots_markdown).
PLOTS_FLOW = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from prefect import flow
    from prefect.artifacts import create_markdown_artifact
    from prefect.runtime import flow_run

    from hvdflow.flows.prefect.benchmark import plots_markdown


    @flow(name="tests-benchmark-plots")
    def show(out: str) -> str:
        paths = []
        for name, values in (("images_per_s", [480, 790]), ("scaling_efficiency", [100, 82])):
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.plot([1, 2], values, "o-")
            ax.set(xlabel="np (ranks)", ylabel=name)
            paths.append(Path(out) / f"{name}.png")
            fig.savefig(paths[-1], dpi=120)
            plt.close(fig)
        create_markdown_artifact(key="tests-benchmark-plots", markdown=plots_markdown(paths))
        return str(flow_run.id)


    print(show(sys.argv[1]))
    """
)


def test_the_benchmark_plots_show_in_the_flow_runs_artifacts(prefect_server, page, tmp_path):
    from playwright.sync_api import expect

    done = subprocess.run(
        [sys.executable, "-c", PLOTS_FLOW, str(tmp_path)],
        env={**os.environ, "PREFECT_API_URL": prefect_server.api_url},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    flow_run_id = done.stdout.strip().splitlines()[-1]

    open_artifact(page, prefect_server.url, flow_run_id, "tests-benchmark-plots")
    images = page.locator("img[src^='data:image/png']")
    expect(images).to_have_count(2)
    for i in range(2):
        image = images.nth(i)
        image.scroll_into_view_if_needed()
        expect(image).to_be_visible()
        # Decoded and drawn: a broken image has no natural width.
        page.wait_for_function(
            "img => img.complete && img.naturalWidth > 0", arg=image.element_handle()
        )
    screenshot(page, "prefect-benchmark-plots")
