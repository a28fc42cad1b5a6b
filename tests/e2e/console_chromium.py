"""The web console in headless Chromium against real processes (tests/e2e/console.rs).

Arguments: CONSOLE_URL ADMIN_TOKEN NODE_URL KEY KEY_ID PRIMARY SECONDARY [SCREENSHOT_DIR]

Signs in, sees two nodes, sees the open breaker, watches a failover arrive on the live page
without a reload, runs a drill and reads its verdict, clears faults, signs out; checks on
every page that nothing was loaded from anywhere but the control plane. With a
SCREENSHOT_DIR, saves the pages as PNG for docs/operating.md. Prints one JSON line per check.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.expected_conditions import staleness_of
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE, TOKEN, NODE, KEY, KEY_ID, PRIMARY, SECONDARY = sys.argv[1:8]
SHOTS = sys.argv[8] if len(sys.argv) > 8 and sys.argv[8] else None
DEADLINE = 30.0


def check(name, **facts):
    print(json.dumps({"check": name, **facts}), flush=True)


def wait(what, predicate, timeout=DEADLINE):
    """Polls `predicate` until it returns something true, or fails naming `what`."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            seen = ""
            if "driver" in globals():
                try:
                    seen = f" (at {driver.current_url}: {driver.find_element(By.TAG_NAME, 'body').text[:2000]})"
                except Exception as e:  # the page itself may be what broke
                    seen = f" ({e})"
            raise AssertionError(f"timed out waiting for {what}{seen}")
        time.sleep(0.1)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def http(method, path, body=None, headers=None):
    opener = urllib.request.build_opener(NoRedirect)
    data = urllib.parse.urlencode(body).encode() if body is not None else None
    request = urllib.request.Request(BASE + path, data=data, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode()


def chat(model, fallback):
    request = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if fallback:
        request["fallback_models"] = fallback
    body = json.dumps(request).encode()
    request = urllib.request.Request(NODE + "/v1/chat/completions", data=body, method="POST",
                                     headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.status


# --- Bad input, over plain HTTP -------------------------------------------------------------
status, headers, body = http("GET", "/ui/fleet")
assert status == 303 and headers.get("location") == "/ui/login", (status, headers)
assert "node" not in body.lower(), body
status, headers, body = http("GET", "/ui/live/stream")
assert status == 401, status
check("no_token_gets_the_login_page")
status, headers, body = http("POST", "/ui/login", {"token": "wrong-token-0000000000"})
assert status == 401 and "Sign-in failed." in body and "wrong-token" not in body, (status, body)
assert headers.get("content-security-policy", "").startswith("default-src 'self'"), headers
check("a_wrong_token_gets_401_and_a_generic_message")
BROWSER_BASE = BASE

# --- The browser ------------------------------------------------------------------------------
options = webdriver.ChromeOptions()
for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--window-size=1280,900", "--no-first-run", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update"]:
    options.add_argument(flag)
options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
driver_path = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
driver = webdriver.Chrome(service=Service(driver_path), options=options)
driver.set_page_load_timeout(DEADLINE)
origin = BROWSER_BASE.rstrip("/")
resources_seen = 0


def only_local():
    """Every resource the page loaded, and every URL it names, is this control plane's."""
    global resources_seen
    urls = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        ".concat(performance.getEntriesByType('navigation').map(e => e.name))"
        ".concat(Array.from(document.querySelectorAll('[src],[href]')).map(e => e.src || e.href))"
        ".concat(Array.from(document.querySelectorAll('form')).map(e => e.action))")
    for url in urls:
        assert url.startswith(origin + "/"), f"{driver.current_url} refers to {url}"
    resources_seen += len(urls)


def shot(name):
    if SHOTS:
        driver.save_screenshot(os.path.join(SHOTS, f"console-{name}.png"))


def go(path):
    driver.get(BROWSER_BASE + path)
    only_local()


def text():
    return driver.find_element(By.TAG_NAME, "main").text


try:
    go("/ui/fleet")
    assert driver.current_url.endswith("/ui/login"), driver.current_url
    shot("login")
    # By keyboard alone: the field has the focus, Enter sends the form.
    assert driver.switch_to.active_element.get_attribute("id") == "token"
    driver.switch_to.active_element.send_keys(TOKEN + Keys.ENTER)
    wait("the fleet page", lambda: driver.current_url.endswith("/ui/fleet"))
    only_local()
    cookie = driver.get_cookie("switchyard_console")
    assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
    rows = driver.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")
    assert len(rows) == 2, [r.text for r in rows]
    node_host = urllib.parse.urlparse(NODE).netloc
    assert node_host in text(), text()
    shot("fleet")
    check("signed_in_and_sees_two_nodes", nodes=len(rows))

    go("/ui/breakers")
    wait("an open breaker on the breakers page",
         lambda: "open" in [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#node-breakers .state")])
    # The fleet's view holds the deployment open for every node, one of them probing it.
    wait("the deployment open for the fleet",
         lambda: driver.find_element(By.CSS_SELECTOR, "#fleet-breakers tbody tr .state").text
         == "open (fleet)")
    fleet_row = driver.find_element(By.CSS_SELECTOR, "#fleet-breakers tbody tr").text
    assert "node-" in fleet_row, fleet_row
    shot("breakers")
    check("sees_the_breaker_open")

    go("/ui/live")
    wait("the live stream to connect",
         lambda: driver.find_element(By.ID, "live-status").text.startswith("Live: new events"))
    before = {r.get_attribute("data-id") for r in driver.find_elements(By.CSS_SELECTOR, "#events tbody tr.row")}
    url_before = driver.current_url
    nav_before = driver.execute_script("return performance.timeOrigin")
    assert chat(PRIMARY, [SECONDARY]) == 200
    fresh = wait("a failover to arrive on the live page",
                 lambda: [r for r in driver.find_elements(By.CSS_SELECTOR, "#events tbody tr.row")
                          if r.get_attribute("data-id") not in before])
    assert driver.execute_script("return performance.timeOrigin") == nav_before, "the page reloaded"
    assert driver.current_url == url_before
    assert SECONDARY in fresh[0].text and KEY_ID in fresh[0].text, fresh[0].text
    only_local()
    shot("live")
    check("a_failover_arrives_live_without_reload", new_rows=len(fresh))

    # The drill form names a missing field and starts nothing.
    go("/ui/drills")
    Select(driver.find_element(By.ID, "drill-scenario")).select_by_value("primary-down")
    # The browser would refuse to send it: take that away, as a hand-made request would.
    driver.execute_script("document.querySelectorAll('#drill-form [required]')"
                          ".forEach(e => e.removeAttribute('required'));")
    Select(driver.find_element(By.ID, "drill-key")).select_by_value(KEY_ID)
    Select(driver.find_element(By.ID, "drill-model")).select_by_value(PRIMARY)
    driver.find_element(By.CSS_SELECTOR, "#drill-form button").click()
    errors = wait("the form's errors", lambda: driver.find_elements(By.ID, "form-errors"))
    assert "node: missing" in errors[0].text, errors[0].text
    assert "key:" not in errors[0].text and "model:" not in errors[0].text, errors[0].text
    assert driver.find_element(By.ID, "drill-scenario").get_attribute("value") == "primary-down"
    check("a_drill_form_with_a_missing_field_names_it")

    # Clear the outage's fault first (the drill's own fault is what its verdict reads).
    go("/ui/drills")
    driver.find_element(By.ID, "clear-all").click()
    wait("the faults to be cleared",
         lambda: driver.find_elements(By.CSS_SELECTOR, "#faults tr.empty"))
    check("faults_cleared")
    # The outage's breaker closes once the node's probe gets through (the breakers page
    # refreshes itself); a drill on a model whose breaker is open would meet no request.
    go("/ui/breakers")
    wait("the primary's breaker to close",
         lambda: not driver.find_elements(By.CSS_SELECTOR, "#node-breakers .state-open, #node-breakers .state-half_open"))
    go("/ui/drills")

    Select(driver.find_element(By.ID, "drill-scenario")).select_by_value("primary-down")
    node_select = Select(driver.find_element(By.ID, "drill-node"))
    node_option = [o for o in node_select.options if node_host in o.text][0]
    node_select.select_by_visible_text(node_option.text)
    Select(driver.find_element(By.ID, "drill-key")).select_by_value(KEY_ID)
    Select(driver.find_element(By.ID, "drill-model")).select_by_value(PRIMARY)
    driver.find_element(By.CSS_SELECTOR, "#drill-form button").click()
    wait("the drill's page", lambda: "/ui/drills/run?id=" in driver.current_url)
    only_local()
    assert "waiting" in driver.find_element(By.ID, "verdict").text, driver.find_element(By.ID, "verdict").text

    # The drill's traffic: the key's requests through the node, until one meets the fault
    # (the node applies it within a heartbeat).
    def drill_traffic():
        chat(PRIMARY, [])
        return "pass" in driver.find_element(By.ID, "verdict").text or \
            "fail" in driver.find_element(By.ID, "verdict").text
    wait("the drill's verdict", drill_traffic)
    verdict = driver.find_element(By.ID, "verdict").text
    assert "Verdict: pass" in verdict and SECONDARY in verdict, verdict
    shot("drill")
    check("a_drill_runs_and_shows_its_verdict", verdict=verdict)
    old_page = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(By.ID, "clear-drill").click()
    WebDriverWait(driver, DEADLINE).until(staleness_of(old_page))
    go("/ui/drills")
    assert "drill-primary-down" not in driver.find_element(By.ID, "faults").text, \
        driver.find_element(By.ID, "faults").text

    for page in ["/ui/keys", "/ui/webhooks"]:
        go(page)
        assert KEY not in driver.page_source, "a key secret is on a page"
    shot("keys")

    driver.find_element(By.CSS_SELECTOR, "form.logout button").click()
    wait("the login page", lambda: driver.current_url.endswith("/ui/login"))
    go("/ui/fleet")
    assert driver.current_url.endswith("/ui/login"), driver.current_url
    check("signed_out")
    check("nothing_loaded_from_outside", urls_checked=resources_seen)
except Exception:
    # What the audit log and the breakers said, to tell a console bug from a node's.
    for page in ["/ui/live", "/ui/breakers", "/ui/drills"]:
        driver.get(BROWSER_BASE + page)
        print(f"--- {page}\n{driver.find_element(By.TAG_NAME, 'main').text[:4000]}", file=sys.stderr)
    raise
finally:
    driver.quit()

# Guessing: one wrong token was sent above, so four more are let through, then refused.
codes = [http("POST", "/ui/login", {"token": f"wrong-{i}"})[0] for i in range(6)]
assert codes[:4] == [401] * 4 and codes[4:] == [429, 429], codes
status, _, _ = http("POST", "/ui/login", {"token": TOKEN})
assert status == 429, "even the right token waits out the window"
check("wrong_tokens_are_rate_limited", codes=codes)
