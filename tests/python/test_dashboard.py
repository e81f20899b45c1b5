"""The dashboard in a real browser: Debian's Chromium driven by Playwright (the pip package, pointed
at /usr/bin/chromium: nothing is downloaded), against a running tandem with a model that has logs
and two trained steps. Accessibility is checked with axe-core (from npm, in target/browser).

Usage: python test_dashboard.py <tandem binary> <model gguf> <axe.min.js> <python with openpipe-art>
Screenshots of each page go to target/dashboard/. Prints 'dashboard: N passed, M failed'.
"""
import os
import re
import subprocess
import sys
import tarfile
import time

from playwright.sync_api import sync_playwright

from tandem_server import finish, rl_step, run_checks, trained_step

KEY = "dashboard-test-key"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SHOTS = os.path.join("target", "dashboard")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
AXE = sys.argv[3] if len(sys.argv) > 3 else ""
ART_PYTHON = sys.argv[4] if len(sys.argv) > 4 else ""
state = {}
checks = []


def check(fn):
    checks.append(fn)
    return fn


def group(rewards):
    return {"trajectories": [{"messages_and_choices": [{"role": "user", "content": "Is the sky blue?"},
                                                       {"role": "assistant", "content": "yes"}],
                              "reward": r} for r in rewards]}


def new_page(browser, **context):
    page = browser.new_context(viewport={"width": 1100, "height": 900}, **context).new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: d.accept())
    return page, errors


def sign_in(page, server, key):
    page.goto(server.url + "/")
    page.fill("#key", key)
    page.click("button[type=submit]")


@check
def seed_a_model_with_logs_and_two_steps(browser, server):
    name, model_id = trained_step(server)
    for rewards in ([0.0, 0.5], [0.25, 0.75]):
        status, out, _ = server.api("POST", f"/v1/preview/models/{model_id}/log",
                                    {"split": "val", "trajectory_groups": [group(rewards)]})
        assert status == 200, out
    state["job"] = rl_step(server, model_id, "Is snow white? Answer yes or no.", seed=9)
    status, out, _ = server.api("POST", f"/v1/preview/models/{model_id}/log",
                                {"split": "val", "trajectory_groups": [group([1.0, 1.0])]})
    assert status == 200 and out["step"] == 2, out
    state["model_id"] = model_id
    os.makedirs(SHOTS, exist_ok=True)


@check
def a_wrong_key_is_refused_with_a_message(browser, server):
    page, errors = new_page(browser)
    sign_in(page, server, "not-a-key")
    alert = page.wait_for_selector("[role=alert]:not(:empty)")
    assert "not accepted" in alert.text_content(), alert.text_content()
    page.screenshot(path=os.path.join(SHOTS, "sign-in.png"))
    assert not errors, errors


@check
def the_reward_curve_shows_the_apis_numbers(browser, server):
    model_id = state["model_id"]
    page, errors = new_page(browser)
    sign_in(page, server, KEY)
    page.wait_for_selector(f'a[href="#/models/{model_id}"]')
    page.screenshot(path=os.path.join(SHOTS, "models.png"))
    page.click(f'a[href="#/models/{model_id}"]')
    figure = page.wait_for_selector('figure:has(figcaption:text-is("val/reward"))')
    _, history, _ = server.api("GET", f"/v1/preview/models/{model_id}/history?max_points=400")
    (series,) = [s for s in history["series"] if s["key"] == "val/reward"]
    expected = [(p["step"], p["value"]) for p in series["points"]]
    # Arrow keys walk the points from the newest back; the readout says "step S: V".
    figure.focus()
    seen = []
    for i in range(len(expected) + 1):
        readout = figure.query_selector(".readout").text_content()
        if readout.startswith("step "):
            where, value = readout.split(":")[:2]
            seen.append((float(where.split()[1]), float(value.split("(")[0])))
        if i < len(expected):
            page.keyboard.press("ArrowLeft")
    got = sorted(set(seen))
    want = sorted({(s, round(v, 5)) for s, v in expected})
    assert [(s, round(v, 5)) for s, v in got] == want, (got, want)
    # The page polls every 5 s; a poll that brings nothing new leaves the chart as it is.
    before = figure.query_selector(".readout").text_content()
    page.wait_for_timeout(6000)
    assert figure.query_selector(".readout").text_content() == before, "a poll reset the point being read"
    assert figure.evaluate("f => f.isConnected && document.activeElement === f"), "a poll redrew the chart"
    assert page.query_selector_all("svg.chart .ckpt"), "checkpoints are marked on the step axis"
    page.screenshot(path=os.path.join(SHOTS, "model.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=os.path.join(SHOTS, "model-phone.png"))
    assert not errors, errors


@check
def the_playground_streams_two_models_side_by_side(browser, server):
    model_id = state["model_id"]
    name, _ = trained_step(server)
    step2 = name.replace(":step1", ":step2")
    page, errors = new_page(browser)
    sign_in(page, server, KEY)
    page.goto(f"{server.url}/#/models/{model_id}")
    page.wait_for_selector("#pg-a")
    page.select_option("#pg-a", step2)
    page.select_option("#pg-b", MODEL)
    page.fill("#pg-prompt", "Is snow white? Answer yes or no.")
    page.fill("#pg-temperature", "0")
    page.fill("#pg-max-tokens", "8")
    page.click("form.playground button[type=submit]")
    page.wait_for_function("() => !document.querySelector('form.playground button[type=submit]').disabled"
                           " && document.getElementById('pg-out-a').textContent.length > 0")
    for target, out in [(step2, "#pg-out-a"), (MODEL, "#pg-out-b")]:
        status, r, _ = server.api("POST", "/v1/chat/completions", {
            "model": target, "messages": [{"role": "user", "content": "Is snow white? Answer yes or no."}],
            "temperature": 0, "top_p": 1, "max_tokens": 8})
        assert status == 200, r
        shown = page.text_content(out)
        assert shown == r["choices"][0]["message"]["content"], (target, shown, r["choices"][0]["message"])
    page.screenshot(path=os.path.join(SHOTS, "playground.png"), full_page=True)
    assert not errors, errors


@check
def another_entity_sees_nothing(browser, server):
    model_id = state["model_id"]
    other = server.new_key("someone-else")
    page, errors = new_page(browser)
    sign_in(page, server, other)
    page.wait_for_selector("h1:text-is('Models')")
    assert not page.query_selector(f'a[href="#/models/{model_id}"]')
    page.goto(f"{server.url}/#/models/{model_id}")
    alert = page.wait_for_selector("[role=alert]")
    assert "not found" in alert.text_content().lower(), alert.text_content()
    assert not errors, errors


@check
def the_models_list_searches_on_the_server(browser, server):
    model_id = state["model_id"]
    page, errors = new_page(browser)
    sign_in(page, server, KEY)
    page.wait_for_selector(f'a[href="#/models/{model_id}"]')
    page.fill("#search", "no-such-model")
    page.press("#search", "Enter")
    page.wait_for_selector("text=No model matches.")
    page.fill("#search", "SDK/TRAIN")
    page.press("#search", "Enter")
    row = page.wait_for_selector(f'tr:has(a[href="#/models/{model_id}"])')
    _, listed, _ = server.api("GET", "/v1/preview/models?search=sdk/train&summary=true")
    summary = listed["data"][0]["summary"]
    cells = [c.text_content() for c in row.query_selector_all("td")]
    assert cells[3] == str(summary["latest_step"]), (cells, summary)
    assert abs(float(cells[4].split(" ")[0]) - summary["last_reward"]) < 1e-3, (cells, summary)
    assert not errors, errors


@check
def zooming_reads_the_range_from_the_server(browser, server):
    model_id = state["model_id"]
    page, errors = new_page(browser)
    sign_in(page, server, KEY)
    page.goto(f"{server.url}/#/models/{model_id}")
    page.wait_for_selector('figure:has(figcaption:text-is("val/reward"))')
    page.fill("#zoom-from", "2")
    page.fill("#zoom-to", "2")
    page.click("form[aria-label='Zoom to steps'] button[type=submit]")
    _, h, _ = server.api("GET", f"/v1/preview/models/{model_id}/history?max_points=400&min_step=2&max_step=2")
    (series,) = [s for s in h["series"] if s["key"] == "val/reward"]
    label = f"val/reward: {len(series['points'])} points"
    page.wait_for_selector(f'svg.chart[aria-label="{label}"]')
    assert all(p["step"] == 2 for p in series["points"]), series
    page.click("text=All steps")
    page.wait_for_selector('svg.chart[aria-label^="val/reward: "]:not([aria-label="' + label + '"])')
    assert not errors, errors


@check
def a_jobs_page_shows_its_progress_and_events(browser, server):
    job = state["job"]
    page, errors = new_page(browser)
    sign_in(page, server, KEY)
    page.goto(f"{server.url}/#/models/{state['model_id']}")
    page.click(f'a[href="#/jobs/{job["id"]}"]')
    _, events, _ = server.api("GET", f"/v1/preview/training-jobs/{job['id']}/events?limit=100")
    steps = sum(1 for e in events["data"] if e["type"] == "gradient_step")
    page.wait_for_selector(f"text={steps} of {steps} gradient steps")
    kinds = [c.text_content() for c in page.query_selector_all("tbody tr td:first-child")]
    assert kinds[0] == "training_ended" and kinds[-1] == "training_started", kinds
    assert len(kinds) == len(events["data"]), (kinds, events)
    page.screenshot(path=os.path.join(SHOTS, "job.png"), full_page=True)
    assert not errors, errors


@check
def the_trajectory_browser_shows_chats_and_tokens_by_logprob(browser, server):
    model_id, job = state["model_id"], state["job"]
    page, errors = new_page(browser)
    sign_in(page, server, KEY)
    page.goto(f"{server.url}/#/models/{model_id}")
    page.click(f'a[href="#/models/{model_id}/trajectories"]')
    # With no job chosen, the newest one is shown.
    page.wait_for_selector(f"h2:text-is('Job {job['id']}')")
    _, api_page, _ = server.api("GET", f"/v1/preview/training-jobs/{job['id']}/trajectories")
    cards = page.query_selector_all("article.trajectory")
    trajs = api_page["groups"][0]["trajectories"]
    assert len(cards) == len(trajs), (len(cards), trajs)
    sampled = cards[1].query_selector_all(".msg.sampled .content")
    assert sampled[0].text_content() == trajs[1]["histories"][0]["messages"][-1]["content"], sampled[0].text_content()
    cards[1].query_selector("details summary").click()
    token = cards[1].query_selector(".tokens .tok")
    token.focus()
    run = next(r for r in trajs[1]["sequences"][0] if r["trained"])
    readout = cards[1].query_selector(".readout").text_content()
    shown = float(re.search(r"logprob (\S+),", readout).group(1))
    assert abs(shown - run["logprob"]) <= 1e-3 * max(1.0, abs(run["logprob"])), (readout, run)
    assert token.evaluate("t => getComputedStyle(t).backgroundColor") != "rgba(0, 0, 0, 0)"
    page.screenshot(path=os.path.join(SHOTS, "trajectories.png"), full_page=True)
    # Sorted, each trajectory keeps its own tokens (the job's stored sequences follow it).
    _, by_reward, _ = server.api("GET", f"/v1/preview/training-jobs/{job['id']}/trajectories?sort=reward_desc")
    first = by_reward["groups"][0]["trajectories"][0]
    assert (first["index"], first["sequences"]) == (1, trajs[1]["sequences"]), first["index"]
    # Sorted by reward, highest first: the reward-1 trajectory leads.
    page.select_option("#tr-sort", "reward_desc")
    page.click("form.toolbar button[type=submit]")
    page.wait_for_function("() => (document.querySelector('article.trajectory h4') || {}).textContent"
                           " && document.querySelector('article.trajectory h4').textContent.startsWith('Trajectory 1 ')")
    assert not errors, errors


@check
def the_server_page_reads_the_metrics(browser, server):
    page, errors = new_page(browser)
    sign_in(page, server, KEY)
    page.wait_for_selector("h1:text-is('Models')")
    page.click("nav >> text=Server")
    page.wait_for_selector(f"th:text-is('{MODEL}')")
    assert page.text_content("#health").startswith("Health: ok"), page.text_content("#health")
    # A request that fails shows up among the errors at the next reading.
    server.api("GET", "/v1/preview/models/not-a-uuid")
    page.wait_for_selector("td:text-is('4xx')", timeout=15000)
    page.screenshot(path=os.path.join(SHOTS, "server.png"), full_page=True)
    assert not errors, errors


@check
def the_api_reference_lists_every_operation(browser, server):
    page, errors = new_page(browser)
    page.goto(f"{server.url}/#/api")
    page.wait_for_selector("details.op")
    _, spec, _ = server.api("GET", "/openapi.json")
    ops = sum(1 for item in spec["paths"].values() for m in item if m in ("get", "post", "put", "patch", "delete"))
    assert len(page.query_selector_all("details.op")) == ops, ops
    page.click("details.op summary >> nth=0")
    page.screenshot(path=os.path.join(SHOTS, "api.png"))
    assert not errors, errors


@check
def an_art_run_is_watched_live(browser, server):
    """The issue's walk-through, small: two tabs open on a model with no job yet, never reloaded,
    while ART's own client runs examples/art_yes_no.py on it (ART registers the model with
    return_existing): the reward curve gains each job's point and the trajectory browser shows
    the newest job, by the pages' own polling."""
    assert ART_PYTHON and os.path.exists(ART_PYTHON), f"no python with openpipe-art given ({ART_PYTHON!r})"
    status, model, _ = server.api("POST", "/v1/preview/models",
                                  {"project": "art-examples", "name": "live", "base_model": MODEL})
    assert status == 200, model
    model_id = model["id"]
    curves, c_errors = new_page(browser)
    sign_in(curves, server, KEY)
    curves.wait_for_selector("h1:text-is('Models')")
    curves.goto(f"{server.url}/#/models/{model_id}")
    curves.wait_for_selector("text=Nothing logged yet.")
    trajs, t_errors = new_page(browser)
    sign_in(trajs, server, KEY)
    trajs.wait_for_selector("h1:text-is('Models')")
    trajs.goto(f"{server.url}/#/models/{model_id}/trajectories")
    trajs.wait_for_selector("text=No RL jobs or logs yet.")
    label = "() => [...document.querySelectorAll('svg.chart')].map(s => s.getAttribute('aria-label'))" \
            ".find(l => l.startsWith('train/reward ')) || ''"
    heading = "() => (document.querySelector('#groups h2') || {}).textContent || ''"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    proc = subprocess.Popen(
        [ART_PYTHON, "examples/art_yes_no.py", "--url", server.url, "--api-key", KEY, "--name", "live",
         "--questions", "2", "--samples", "4", "--steps", "3", "--art-path", os.path.join("target", "dashboard-art")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        counts = []
        deadline = time.monotonic() + 600
        while True:
            shown = curves.evaluate(label)
            n = int(re.search(r": (\d+) points", shown).group(1)) if shown else 0
            if not counts or counts[-1] != n:
                counts.append(n)
            if n == 3 and proc.poll() is not None:
                break
            assert time.monotonic() < deadline, counts
            time.sleep(0.5)
        out = proc.stdout.read()
        assert proc.returncode == 0, out
        assert counts[0] == 0 and counts[-1] == 3, (counts, out)
        _, listed, _ = server.api("GET", f"/v1/preview/models/{model_id}/training-jobs?order=desc")
        newest = [j["id"] for j in listed["data"] if j["kind"] == "rl"][0]
        trajs.wait_for_function(f"() => ({heading})() === 'Job {newest}'", timeout=15000)
        curves.screenshot(path=os.path.join(SHOTS, "model-live.png"), full_page=True)
        assert not c_errors and not t_errors, (c_errors, t_errors)
    finally:
        if proc.poll() is None:
            proc.kill()


@check
def a_checkpoint_downloads_as_a_peft_adapter(browser, server):
    model_id = state["model_id"]
    page, errors = new_page(browser, accept_downloads=True)
    sign_in(page, server, KEY)
    page.goto(f"{server.url}/#/models/{model_id}")
    with page.expect_download() as info:
        page.click("button[aria-label='Download checkpoint 2 as a PEFT adapter']")
    download = info.value
    assert download.suggested_filename == "sdk-trained-step2.tar", download.suggested_filename
    saved = os.path.join(SHOTS, download.suggested_filename)
    download.save_as(saved)
    with tarfile.open(saved) as tar:
        names = sorted(tar.getnames())
    assert names == ["sdk-trained-step2/adapter_config.json", "sdk-trained-step2/adapter_model.safetensors"], names
    _, direct, _ = server.api("GET", f"/v1/preview/models/{model_id}/checkpoints/2/adapter")
    assert open(saved, "rb").read() == direct, "the page saves exactly what the API answers"
    assert not errors, errors


@check
def deleting_a_checkpoint_removes_it(browser, server):
    model_id = state["model_id"]
    page, errors = new_page(browser)
    sign_in(page, server, KEY)
    page.goto(f"{server.url}/#/models/{model_id}")
    page.click("button[aria-label='Delete checkpoint 1']")
    page.wait_for_selector("button[aria-label='Delete checkpoint 1']", state="detached")
    _, cps, _ = server.api("GET", f"/v1/preview/models/{model_id}/checkpoints")
    assert [c["step"] for c in cps["data"]] == [2], cps
    assert not errors, errors


@check
def no_serious_accessibility_violations(browser, server):
    if not AXE:
        raise AssertionError("no axe.min.js given")
    model_id = state["model_id"]
    # axe runs as an injected script, which the pages' CSP forbids: this context bypasses it.
    page, errors = new_page(browser, bypass_csp=True)
    bad = []
    routes = ["/", f"/#/models/{model_id}", f"/#/models/{model_id}/trajectories", f"/#/jobs/{state['job']['id']}",
              "/#/server", "/#/api"]
    for route in routes:
        sign_in(page, server, KEY) if route == "/" else page.goto(server.url + route)
        page.wait_for_selector("main h1")
        page.wait_for_timeout(300)
        page.add_script_tag(path=AXE)
        result = page.evaluate("async () => (await axe.run()).violations.map(v => [v.id, v.impact, v.nodes.length])")
        bad += [(route, *v) for v in result if v[1] in ("serious", "critical")]
    assert not bad, bad
    # The checker itself works: a picture without a text alternative is a critical violation.
    page.set_content('<!doctype html><html lang="en"><title>t</title><main><img src="data:,"></main></html>')
    page.add_script_tag(path=AXE)
    ids = page.evaluate("async () => (await axe.run()).violations.map(v => v.id)")
    assert "image-alt" in ids, ids
    assert not errors, errors


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            return run_checks("dashboard", checks, sys.argv[1], sys.argv[2], KEY, lambda server: browser)
        finally:
            browser.close()


if __name__ == "__main__":
    finish(main())
