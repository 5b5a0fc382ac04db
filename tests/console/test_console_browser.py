"""The web console in a real browser: Debian's headless Chromium driven by Selenium, against a
real ``sqsq server`` (credentials on) and a cluster's gateway (open, so read-only).

The pages' numbers are checked against GetQueueAttributes through the SDK; a peek must show
the bodies and change nothing; purge and redrive go through their confirmation with
credentials and are refused without. No browser is a failure, never a skip.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from serverproc import REPO, ServerProcess
from sqsq.client import Client

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
KEY_ID, SECRET = "console-key", "console-secret-0123456789"
# The screenshot docs/console.md shows: written there only when asked
# (SQSQ_CONSOLE_SCREENSHOT=docs/console.png), so a test run leaves the tree as it was.
SCREENSHOT_ENV = "SQSQ_CONSOLE_SCREENSHOT"
DEPTHS = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
          "ApproximateNumberOfMessagesDelayed")


def until(condition: Callable[[], object], timeout_s: float = 15.0, what: str = "") -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """One headless Chromium for the module, from Debian's packages (make system-deps):
    Selenium is pointed at both binaries, so it never looks for a browser on the network."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1500"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER),
                                  options=options)
    except (WebDriverException, OSError) as e:
        pytest.fail(f"no browser could start ({CHROMIUM}, {CHROMEDRIVER}; `make system-deps` "
                    f"installs Debian's chromium and chromium-driver): {e}")
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def signed_in(driver: webdriver.Chrome, credentials: tuple[str, str] | None) -> None:
    """Send HTTP basic auth with every request the page makes (or stop sending it)."""
    driver.execute_cdp_cmd("Network.enable", {})
    headers = {}
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def http_post(url: str, data: dict[str, str], credentials: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(url, data="&".join(f"{k}={v}" for k, v in data.items())
                                     .encode(), method="POST")
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def depths(client: Client, queue: str) -> tuple[int, int, int]:
    attrs = client.get_queue_attributes(queue, list(DEPTHS))
    return tuple(int(attrs[n]) for n in DEPTHS)  # type: ignore[return-value]


def shown_depths(driver: webdriver.Chrome, scope: str) -> tuple[int, int, int]:
    return tuple(int(driver.find_element(By.CSS_SELECTOR, f"{scope} td.{c}").text)
                 for c in ("visible", "inflight", "delayed"))  # type: ignore[return-value]


@pytest.fixture(scope="module")
def locked_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with credentials (so the console may purge and redrive) and a depth sample
    every 0.5 s (so the chart fills within the test)."""
    srv = ServerProcess(tmp_path_factory.mktemp("console") / "data", env={
        "SQSQ_ACCESS_KEY_ID": KEY_ID, "SQSQ_SECRET_ACCESS_KEY": SECRET,
        "SQSQ_CONSOLE_SAMPLE_S": "0.5"}).start()
    yield srv
    srv.stop()


def test_console_on_a_server_with_credentials(browser: webdriver.Chrome,
                                              locked_server: ServerProcess,
                                              tmp_path: Path) -> None:
    client = Client(locked_server.endpoint, credentials=(KEY_ID, SECRET))
    dlq = client.create_queue("orders-dlq")
    dlq_arn = client.get_queue_attributes(dlq, ["QueueArn"])["QueueArn"]
    orders = client.create_queue("orders", {"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3})})
    bodies = [f"order {i}" for i in range(4)] + ['<b>bold</b> & "quoted" <script>x()</script>']
    for body in bodies:
        client.send_message(orders, body)
    client.send_message(orders, "later", delay_seconds=600)
    in_flight = client.receive_message(orders, 2, visibility_timeout=600)
    assert len(in_flight) == 2
    # Two messages dead-lettered from another source (one receive allowed).
    payments = client.create_queue("payments", {"VisibilityTimeout": "0", "RedrivePolicy":
                                   json.dumps({"deadLetterTargetArn": dlq_arn,
                                               "maxReceiveCount": 1})})
    for body in ("dead 1", "dead 2"):
        client.send_message(payments, body)
    assert len(client.receive_message(payments, 10)) == 2
    until(lambda: client.receive_message(payments, 10) == [] and
          depths(client, dlq) == (2, 0, 0), what="the dead-letter moves")
    assert depths(client, orders) == (3, 2, 1)
    base = locked_server.http_url + "/console"

    # Without credentials: nothing is shown, and nothing can be changed.
    signed_in(browser, None)
    browser.get(base)  # the browser gets a 401 asking for basic auth; headless, it asks no one
    assert not browser.find_elements(By.ID, "queues") and "orders" not in browser.page_source
    assert http_status(base) == http_status(f"{base}/queues/orders") == 401
    assert http_post(f"{base}/queues/orders/purge", {"token": "x"}) == 401
    assert http_post(f"{base}/queues/orders/purge", {"token": "x"}, (KEY_ID, "wrong")) == 401
    # Signed in, but without the confirm page's token: refused too.
    assert http_post(f"{base}/queues/orders/purge", {"token": "x"}, (KEY_ID, SECRET)) == 403
    assert depths(client, orders) == (3, 2, 1)

    # The queue table and the shard map, against the API.
    signed_in(browser, (KEY_ID, SECRET))
    browser.get(base)
    assert f"signed in as {KEY_ID}" in browser.find_element(By.TAG_NAME, "header").text
    for name, url in (("orders", orders), ("orders-dlq", dlq)):
        assert shown_depths(browser, f'tr[data-queue="{name}"]') == depths(client, url)
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="orders"]')
    assert row.find_element(By.CSS_SELECTOR, "td.dlq").text.startswith("orders-dlq")
    assert row.find_element(By.CSS_SELECTOR, "td.oldest").text.endswith(" s")
    shard = browser.find_element(By.CSS_SELECTOR, 'tr[data-shard="0"]')
    assert "this server" in shard.find_element(By.CSS_SELECTOR, "td.leader").text
    assert "live" in shard.find_element(By.CSS_SELECTOR, "td.replicas").text

    # Click through to the queue: the peek shows every body (markup as text), in its state.
    row.find_element(By.LINK_TEXT, "orders").click()
    until(lambda: browser.find_elements(By.ID, "queue-name"), what="the queue page")
    assert browser.find_element(By.ID, "queue-name").text == "orders"
    assert shown_depths(browser, "#depth") == (3, 2, 1)
    peeked = browser.find_elements(By.CSS_SELECTOR, "#peek tbody tr")
    shown = {r.find_element(By.CSS_SELECTOR, "pre.body").text:
             r.find_element(By.CSS_SELECTOR, "td.state").text.split("\n")[0] for r in peeked}
    received = {m.body for m in in_flight}
    assert shown == {**{b: "visible" for b in bodies if b not in received},
                     **{b: "in flight" for b in received}, "later": "delayed"}
    assert not browser.find_elements(By.CSS_SELECTOR, "#peek pre.body b, #peek script")
    # The chart fills from the process's own samples.
    until(lambda: (browser.refresh() or int(browser.find_element(By.ID, "chart")
                                            .get_attribute("data-samples")) >= 3),
          what="three depth samples")
    points = browser.find_element(By.CSS_SELECTOR, 'polyline[data-series="visible"]')
    assert len(points.get_attribute("points").split()) >= 3
    screenshot = os.environ.get(SCREENSHOT_ENV) or str(tmp_path / "console.png")
    assert browser.save_screenshot(str(REPO / screenshot))
    assert (REPO / screenshot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Peeking (four page loads by now) changed nothing: the same counts, and the visible
    # messages' first receive is still their first.
    assert depths(client, orders) == (3, 2, 1)
    got = client.receive_message(orders, 10, visibility_timeout=600,
                                 attribute_names=["ApproximateReceiveCount"])
    assert len(got) == 3 and {m.attributes["ApproximateReceiveCount"] for m in got} == {"1"}

    # Purge behind its confirmation: cancel changes nothing, confirm empties the queue.
    browser.find_element(By.ID, "purge").click()
    until(lambda: browser.find_elements(By.ID, "confirm"), what="the confirm page")
    browser.find_element(By.ID, "cancel").click()
    until(lambda: browser.find_elements(By.ID, "queue-name"), what="the queue page")
    assert depths(client, orders) == (0, 5, 1)
    browser.find_element(By.ID, "purge").click()
    until(lambda: browser.find_elements(By.ID, "confirm"), what="the confirm page")
    browser.find_element(By.ID, "confirm").click()
    until(lambda: browser.find_elements(By.ID, "done"), what="the purge's answer")
    until(lambda: depths(client, orders) == (0, 0, 0), what="the purge")

    # Redrive the dead-letter queue back to its source.
    browser.get(f"{base}/queues/orders-dlq")
    assert browser.find_element(By.ID, "sources").text.endswith("orders, payments")
    browser.find_element(By.ID, "redrive").click()
    until(lambda: browser.find_elements(By.ID, "confirm"), what="the confirm page")
    browser.find_element(By.ID, "confirm").click()
    until(lambda: browser.find_elements(By.ID, "done"), what="the redrive's answer")
    until(lambda: depths(client, dlq) == (0, 0, 0) and depths(client, payments) == (2, 0, 0),
          what="the redrive")
    client.close()


def test_console_on_a_cluster_gateway_is_read_only(browser: webdriver.Chrome,
                                                    cluster) -> None:  # noqa: ANN001
    client = Client(cluster.endpoint)
    queue = client.create_queue("console-cluster")
    for i in range(3):
        client.send_message(queue, f"cluster {i}")
    (taken,) = client.receive_message(queue, 1, visibility_timeout=600)
    base = cluster.http_url + "/console"
    signed_in(browser, None)
    browser.get(base)
    assert "read-only" in browser.find_element(By.TAG_NAME, "header").text
    assert shown_depths(browser, 'tr[data-queue="console-cluster"]') == depths(client, queue) \
        == (2, 1, 0)
    # The shard map: both shards, each with a leader among its three live replicas.
    shards = browser.find_elements(By.CSS_SELECTOR, "#shards tbody tr")
    assert len(shards) == 2
    for row in shards:
        replicas = row.find_elements(By.CSS_SELECTOR, "span.replica")
        assert len(replicas) == 3 and all("live" in r.text for r in replicas)
        leader = row.find_element(By.CSS_SELECTOR, "td.leader").text.split()[0]
        assert leader in {r.get_attribute("data-node") for r in replicas}

    browser.find_element(By.LINK_TEXT, "console-cluster").click()
    until(lambda: browser.find_elements(By.ID, "queue-name"), what="the queue page")
    states = {r.find_element(By.CSS_SELECTOR, "pre.body").text:
              r.find_element(By.CSS_SELECTOR, "td.state").text.split("\n")[0]
              for r in browser.find_elements(By.CSS_SELECTOR, "#peek tbody tr")}
    assert states == {**{f"cluster {i}": "visible" for i in range(3)}, taken.body: "in flight"}
    assert not browser.find_elements(By.ID, "purge")
    assert http_post(f"{base}/queues/console-cluster/purge", {"token": "x"}) == 403
    assert depths(client, queue) == (2, 1, 0)
    client.close()

