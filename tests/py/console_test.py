"""Drives the Orca console in Debian's chromium through Playwright, as a user
would: log in with a key, open each page, backfill from the form and watch
the runs finish, cancel a queued run, check a code link, log out.

    console_test.py BASE KEY SCREENSHOTS PIPELINE PARKED_PIPELINE PARKED_RUN

Exits non-zero with what went wrong; saves a screenshot of each page.
"""
import os
import re
import sys

from playwright.sync_api import expect, sync_playwright

base, key, shots, pipeline, parked, parked_run = sys.argv[1:7]
os.makedirs(shots, exist_ok=True)


def shot(page, name):
    page.screenshot(path=os.path.join(shots, f"{name}.png"), full_page=True)


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(20_000)

    # No session: the login page. A wrong key is refused on the page.
    page.goto(f"{base}/console/")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    page.get_by_label("API key").fill("orca_ak_wrong")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("OR087")
    shot(page, "login")
    page.get_by_label("API key").fill(key)
    page.get_by_label("API key").press("Enter")

    # Pipelines: both, with their state.
    expect(page.get_by_role("heading", name="Pipelines")).to_be_visible()
    pipelines = page.get_by_role("table", name="pipelines")
    expect(pipelines.get_by_role("link", name=pipeline, exact=True)).to_be_visible()
    expect(pipelines.get_by_role("link", name=parked, exact=True)).to_be_visible()
    expect(page.locator("#who")).to_contain_text("operator")
    shot(page, "pipelines")

    # Keyboard: the sections are reachable with Tab, and Enter follows one.
    page.locator("header .brand").focus()
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.textContent")
    if focused != "Pipelines":
        raise SystemExit(f"the Tab stop after the brand is {focused!r}, not the Pipelines link")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"#/pipelines$"))

    # A pipeline: backfill two months from the form and watch them finish.
    pipelines.get_by_role("link", name=pipeline, exact=True).click()
    expect(page.get_by_role("heading", name=f"Pipeline {pipeline}")).to_be_visible()
    page.get_by_role("textbox", name="Backfill partitions").fill("2024-01..2024-02")
    page.get_by_role("button", name="Queue runs").click()
    expect(page.locator("#queued")).to_contain_text("2 run(s) queued")
    expect(page.locator("#queued")).to_contain_text("2 finished", timeout=120_000)
    queued = page.get_by_role("table", name="queued runs")
    expect(queued.locator(".st-succeeded")).to_have_count(2)
    # The partition timeline shows both months at their latest run.
    timeline = page.get_by_role("table", name="partitions by latest run")
    expect(timeline).to_contain_text("2024-01")
    expect(timeline).to_contain_text("2024-02")
    # Two more months in one run: the form's partitions a run.
    page.get_by_role("textbox", name="Backfill partitions").fill("2024-03..2024-04")
    page.get_by_role("spinbutton", name="Partitions per run").fill("2")
    page.get_by_role("button", name="Queue runs").click()
    expect(page.locator("#queued")).to_contain_text("1 run(s) queued")
    expect(page.locator("#queued")).to_contain_text("1 finished", timeout=120_000)
    expect(queued).to_contain_text("2024-03,2024-04")
    expect(queued.locator(".st-succeeded")).to_have_count(1)
    expect(timeline).to_contain_text("2024-04")
    shot(page, "pipeline")

    # A run: the grid, the attempts and the log its runner shipped.
    queued.get_by_role("link").first.click()
    expect(page.get_by_role("heading", name=re.compile(r"^Run \d+$"))).to_be_visible()
    grid = page.get_by_role("table", name="steps by partition")
    expect(grid.locator(".st-succeeded").first).to_be_visible()
    expect(page.get_by_role("table", name="attempts")).to_contain_text("succeeded")
    expect(page.locator("#log")).not_to_be_empty(timeout=30_000)
    expect(page.get_by_role("button", name="Cancel run")).to_be_disabled()
    # Its timeline: the wait, the attempt and each step's tries as bars.
    expect(page.get_by_role("img", name=re.compile(r"^timeline of run \d+"))).to_be_visible()
    bars = page.locator("svg.run-timeline rect.bar").count()
    if bars < 3:
        raise SystemExit(f"the run's timeline has {bars} bars, not the wait, an attempt and its steps")
    if page.locator("svg.run-timeline rect.bar.st-succeeded").count() < 2:
        raise SystemExit("the run's timeline shows no succeeded attempt and steps")
    box = page.locator("svg.run-timeline").bounding_box()
    if not box or box["height"] < 60:
        raise SystemExit(f"the run's timeline is drawn {box} high: its rows are hidden")
    shot(page, "run")

    # The parked pipeline's code link goes to its repository at the commit.
    page.goto(f"{base}/console/#/pipelines/{parked}")
    link = page.locator("a.code-link").first
    href = link.get_attribute("href")
    if not re.fullmatch(r"https://github\.com/example/orca-pipelines/tree/[0-9a-f]+", href or ""):
        raise SystemExit(f"the code link is {href!r}")
    # Each version with its runs.
    expect(page.get_by_role("table", name="versions")).to_contain_text(f"last: {parked_run}")
    step = page.locator("a.step-link").first
    want = "https://github.com/example/orca-pipelines/blob/0123456789abcdef0123456789abcdef01234567/src/steps.rs#L42"
    if step.get_attribute("href") != want:
        raise SystemExit(f"the step's link is {step.get_attribute('href')!r}, not {want}")
    # Follow it: no network here, so the request is caught and answered.
    page.route("https://github.com/**", lambda route: route.fulfill(
        status=200, content_type="text/html", body="<h1>the repository at the commit</h1>"))
    link.click()
    expect(page.get_by_role("heading", name="the repository at the commit")).to_be_visible()
    if page.url != href:
        raise SystemExit(f"the code link led to {page.url}, not {href}")

    # Cancel a queued run from its page.
    page.goto(f"{base}/console/#/runs/{parked_run}")
    expect(page.locator("#run-head")).to_contain_text("queued")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-head")).to_contain_text("cancelled")
    expect(page.get_by_role("button", name="Retry run")).to_be_enabled()
    shot(page, "cancelled")

    # Datasets and lineage: the graph and the table.
    page.get_by_role("link", name="Datasets").click()
    expect(page.get_by_role("heading", name="Datasets and lineage")).to_be_visible()
    expect(page.get_by_role("img", name=re.compile("lineage"))).to_be_visible()
    expect(page.get_by_role("table", name="datasets")).to_contain_text(f"{parked}.clean")
    shot(page, "datasets")
    # A dataset's page: its maintenance, and a button that queues a run of it
    # (under the pipeline that writes it, in its pool: no runner takes it here).
    page.get_by_role("table", name="datasets").get_by_role("link", name=f"{parked}.clean", exact=True).click()
    runs = page.get_by_role("table", name="maintenance runs")
    expect(runs).to_contain_text("Never maintained")
    page.get_by_role("button", name="Maintain now").click()
    expect(page.locator("#run-head")).to_contain_text(f"manual run of {parked}")
    page.go_back()
    expect(runs).to_contain_text("manual")
    expect(runs).to_contain_text(parked)
    shot(page, "dataset")

    # Webhooks: each delivery try a row, with the endpoint's answer.
    page.get_by_role("link", name="Webhooks", exact=True).click()
    tries = page.get_by_role("table", name=re.compile("deliveries of endpoint"))
    expect(tries).to_contain_text("503")
    expect(tries.locator(".st-delivered")).to_have_count(1)
    # (orca serve relays too: its own tries at the unreachable host add failed rows.)
    expect(tries.locator(".st-failed").first).to_be_visible()
    shot(page, "webhooks")

    # Incidents: the open one shows on every page; its page has its timeline,
    # what it may leave stale, and a button that resolves it.
    badge = page.locator("#open-incidents")
    expect(badge).to_contain_text(re.compile(r"\d+ open incidents?"))
    badge.click()
    open_table = page.get_by_role("table", name="open incidents")
    expect(open_table).to_contain_text("the disk is full")
    open_table.get_by_role("row").filter(has_text="the disk is full").get_by_role("link").first.click()
    expect(page.locator("#incident-head")).to_contain_text("run_failed")
    expect(page.get_by_role("img", name=re.compile("events"))).to_be_visible()
    expect(page.get_by_role("table", name="affected datasets")).to_contain_text("broken.out")
    shot(page, "incident")
    page.get_by_role("button", name="Resolve").click()
    expect(page.locator("#incident-head")).to_contain_text("resolved")
    page.get_by_role("link", name="Incidents", exact=True).click()
    expect(page.get_by_role("table", name="resolved incidents")).to_contain_text("the disk is full")
    expect(page.get_by_role("table", name="open incidents")).not_to_contain_text("the disk is full")

    # Syncs: each stream with its mode and the delivery level it keeps.
    page.get_by_role("link", name="Syncs", exact=True).click()
    expect(page.get_by_role("table", name="syncs")).to_contain_text(re.compile(r"events \(\w+\): \w+_once"))
    # A sync's page: pause, resume and scale it; bad lanes are refused.
    page.get_by_role("link", name="mirror", exact=True).click()
    # Its epochs as a chart: rows per epoch, and the time between commits.
    expect(page.get_by_role("img", name=re.compile(r"^\d+ epochs: rows committed"))).to_be_visible()
    if page.locator("svg.epochs rect.bar").count() < 1:
        raise SystemExit("the sync's chart has no epoch")
    box = page.locator("svg.epochs rect.bar").first.bounding_box()
    if not box or box["height"] < 20:
        raise SystemExit(f"the sync's epoch bar is drawn {box}: blank")
    expect(page.get_by_role("table", name="epochs")).to_contain_text("events: ")
    shot(page, "sync")
    head = page.locator("#sync-head")
    expect(head).to_contain_text("active")
    page.get_by_role("button", name="Pause sync").click()
    expect(head).to_contain_text("paused")
    expect(page.get_by_role("button", name="Pause sync")).to_be_disabled()
    page.get_by_role("button", name="Resume sync").click()
    expect(head).to_contain_text("active")
    page.get_by_label("writer lanes").fill("3")
    page.get_by_role("button", name="Scale").click()
    expect(head).to_contain_text("3 writer lane(s)")
    page.get_by_label("writer lanes").fill("99")
    page.get_by_role("button", name="Scale").click()
    expect(page.get_by_role("alert")).to_contain_text("OR063")
    expect(head).to_contain_text("3 writer lane(s)")

    for section, heading in [("Syncs", "Syncs"), ("Runners", "Runners"), ("Runs", "Runs")]:
        page.get_by_role("link", name=section, exact=True).click()
        expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
        shot(page, section.lower())
    expect(page.get_by_role("table", name="runs")).to_contain_text("cancelled")

    # Log out: the API answers 401 again, and the console asks for a key.
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    status = page.evaluate("fetch('/api/v1/session').then(r => r.status)")
    if status != 401:
        raise SystemExit(f"after logging out /api/v1/session answered {status}")

    if errors:
        raise SystemExit(f"the page had script errors: {errors}")
    browser.close()
print("console ok")
