"""The three browser engines Lantern's runtime runs in, headless, behind one small interface.

- ``chromium`` (Blink): Playwright driving the system's Chromium, WebGPU on (SwiftShader where there is
  no GPU) unless asked otherwise.
- ``firefox`` (Gecko): Debian's ``firefox-esr`` spoken to over WebDriver BiDi, which Firefox serves
  itself (no geckodriver), from a fresh profile per launch.
- ``webkit`` (WebKit, JavaScriptCore: Safari's engine): WebKitGTK's ``MiniBrowser`` through
  ``WebKitWebDriver`` (Debian's ``webkit2gtk-driver``) on a virtual screen (``xvfb-run``), with the
  storage features Safari ships turned on and SharedArrayBuffer exposed on cross-origin isolated
  pages, as Safari does.

No browser is ever downloaded: each engine is the system's, found on PATH (``missing`` says which are
not). ``evaluate(fn, arg)`` takes a JavaScript function's source, as Playwright's does, awaits it and
returns its result through JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterator, Protocol, TypeVar

from .errors import LanternError

ENGINES = ("chromium", "firefox", "webkit")

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-unsafe-webgpu",
    "--enable-dawn-features=disable_robustness",
]


def chromium_path() -> str | None:
    """The system's Chromium (or Chrome), for Playwright's executable_path."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def chromium_args(webgpu: bool = True) -> list[str]:
    """Chromium's headless flags here: WebGPU on (SwiftShader where there is no GPU) unless ``webgpu`` is False."""
    return CHROMIUM_ARGS if webgpu else [a for a in CHROMIUM_ARGS if "webgpu" not in a]


# Firefox's remote agent sets its own automation preferences (no updates, no telemetry); these quiet the
# rest of its start-up traffic, which has nowhere to go on a machine without internet.
FIREFOX_PREFS = {
    "browser.shell.checkDefaultBrowser": False,
    "browser.startup.page": 0,
    "app.normandy.enabled": False,
    "browser.region.update.enabled": False,
    "browser.region.network.url": "",
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
    "browser.safebrowsing.downloads.enabled": False,
    "browser.safebrowsing.update.enabled": False,
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "network.dns.disablePrefetch": True,
    "network.http.speculative-parallel-limit": 0,
    "extensions.getAddons.cache.enabled": False,
    "media.gmp-manager.updateEnabled": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "browser.newtabpage.enabled": False,
}

# MiniBrowser leaves off what Safari ships on: OPFS and the Storage API (navigator.storage.estimate)
WEBKIT_FEATURES = "+FileSystem,+FileSystemWritableStream,+StorageAPI,+StorageAPIEstimate"


def _minibrowser() -> str | None:
    for base in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"):
        for api in ("webkit2gtk-4.1", "webkit2gtk-4.0", "webkitgtk-6.0"):
            path = f"{base}/{api}/MiniBrowser"
            if os.access(path, os.X_OK):
                return path
    return None


def missing(name: str) -> str | None:
    """Why the engine ``name`` cannot run here (what to install), or None when it can."""
    if name == "chromium":
        if not chromium_path():
            return "no Chromium found on PATH (install `chromium`, e.g. `apt-get install chromium`)"
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            return "playwright is not installed (pip install playwright)"
        return None
    if name == "firefox":
        if not (shutil.which("firefox-esr") or shutil.which("firefox")):
            return "no Firefox on PATH (apt-get install firefox-esr)"
        try:
            import websockets.sync.client  # noqa: F401
        except ImportError:
            return "the websockets package is not installed (pip install websockets)"
        return None
    if name == "webkit":
        if not shutil.which("WebKitWebDriver") or _minibrowser() is None:
            return "no WebKitWebDriver or MiniBrowser (apt-get install webkit2gtk-driver)"
        if not shutil.which("xvfb-run"):
            return "no xvfb-run for WebKitGTK's window (apt-get install xvfb)"
        return None
    raise LanternError(f"unknown browser {name!r}: one of {', '.join(ENGINES)}")


class BrowserError(LanternError):
    """A script threw in the page, or the browser or its driver failed."""


class Page(Protocol):
    def goto(self, url: str) -> None: ...
    def evaluate(self, fn: str, arg: Any = None) -> Any: ...
    def wait_for(self, condition: str, timeout: float = 60) -> None: ...
    def close(self) -> None: ...


class Browser(Protocol):
    name: str

    def new_page(self) -> Page: ...
    def close(self) -> None: ...


def _call_source(fn: str, arg: Any) -> str:
    """An async expression that calls ``fn`` with ``arg`` and gives its result as JSON text."""
    return f"(async () => JSON.stringify((await ({fn})({json.dumps(arg)})) ?? null))()"


def _poll(page: Page, condition: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not page.evaluate(f"() => Boolean({condition})"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{condition} did not hold within {timeout:.0f} s")
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------ Chromium


class _ChromiumPage:
    def __init__(self, page) -> None:
        self.page = page

    def goto(self, url: str) -> None:
        self.page.goto(url)

    def evaluate(self, fn: str, arg: Any = None) -> Any:
        try:
            return self.page.evaluate(fn, arg)
        except Exception as err:  # noqa: BLE001 - Playwright's error carries the page's message
            raise BrowserError(str(err).split("\n")[0]) from None

    def wait_for(self, condition: str, timeout: float = 60) -> None:
        self.page.wait_for_function(condition, timeout=timeout * 1000)

    def close(self) -> None:
        self.page.close()


class _Chromium:
    name = "chromium"

    def __init__(self, webgpu: bool) -> None:
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        try:
            self.browser = self._pw.chromium.launch(executable_path=chromium_path(), headless=True, args=chromium_args(webgpu))
            self.context = self.browser.new_context()
        except BaseException:
            self._pw.stop()
            raise

    def new_page(self) -> Page:
        return _ChromiumPage(self.context.new_page())

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            self._pw.stop()


# ------------------------------------------------------------------------------------------- Firefox


class _FirefoxPage:
    def __init__(self, fx: _Firefox, context: str) -> None:
        self.fx, self.context = fx, context

    def goto(self, url: str) -> None:
        self.fx.command("browsingContext.navigate", {"context": self.context, "url": url, "wait": "complete"})

    def evaluate(self, fn: str, arg: Any = None) -> Any:
        result = self.fx.command(
            "script.evaluate",
            {
                "expression": _call_source(fn, arg),
                "target": {"context": self.context},
                "awaitPromise": True,
                "resultOwnership": "none",
            },
        )
        if result["type"] == "exception":
            details = result["exceptionDetails"]
            raise BrowserError(f"firefox: {details.get('text', 'the script threw')}")
        return json.loads(result["result"]["value"])

    def wait_for(self, condition: str, timeout: float = 60) -> None:
        _poll(self, condition, timeout)

    def close(self) -> None:
        self.fx.command("browsingContext.close", {"context": self.context})


class _Firefox:
    """Firefox over WebDriver BiDi: commands in order, answers matched by id, events skipped."""

    name = "firefox"

    def __init__(self, prefs: dict | None = None, timeout: float = 600) -> None:
        from websockets.sync.client import connect

        self.timeout, self._id, self.ws = timeout, 0, None
        self.profile = tempfile.mkdtemp(prefix="lantern-firefox-")
        prefs = {**FIREFOX_PREFS, **(prefs or {})}
        with open(os.path.join(self.profile, "user.js"), "w") as f:
            for key, value in prefs.items():
                f.write(f"user_pref({json.dumps(key)}, {json.dumps(value)});\n")
        binary = shutil.which("firefox-esr") or shutil.which("firefox")
        assert binary is not None  # open_browser checked missing("firefox")
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-remote", "--profile", self.profile, "--remote-debugging-port=0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        stderr = self.proc.stderr
        assert stderr is not None  # stderr=PIPE
        try:
            url = None
            for line in stderr:  # "WebDriver BiDi listening on ws://127.0.0.1:PORT"
                if "WebDriver BiDi listening on " in line:
                    url = line.split(" on ", 1)[1].strip()
                    break
            if url is None:
                raise BrowserError("firefox exited before it listened for WebDriver BiDi")
            # keep reading its stderr, so Firefox never blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
            self.ws = contextlib.ExitStack().enter_context(connect(url + "/session", max_size=None, open_timeout=30))
            self.command("session.new", {"capabilities": {}})
            self._first = self.command("browsingContext.getTree", {})["contexts"][0]["context"]
        except BaseException:
            self.close()
            raise

    def command(self, method: str, params: dict) -> dict:
        assert self.ws is not None  # connected in __init__, until close()
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == self._id:
                if msg.get("type") == "error":
                    raise BrowserError(f"firefox: {msg['error']}: {msg.get('message')}")
                return msg["result"]

    def new_page(self) -> Page:
        if self._first is not None:  # the window Firefox opened with
            context, self._first = self._first, None
        else:
            context = self.command("browsingContext.create", {"type": "tab"})["context"]
        return _FirefoxPage(self, context)

    def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                self.command("browser.close", {})
            self.ws.close()
            self.ws = None
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


# -------------------------------------------------------------------------------------------- WebKit


class _WebKitPage:
    def __init__(self, wk: _WebKit, handle: str) -> None:
        self.wk, self.handle = wk, handle

    def _here(self) -> str:
        if self.wk.current != self.handle:
            self.wk.request("POST", "/window", {"handle": self.handle})
            self.wk.current = self.handle
        return self.handle

    def goto(self, url: str) -> None:
        self._here()
        self.wk.request("POST", "/url", {"url": url})

    def evaluate(self, fn: str, arg: Any = None) -> Any:
        self._here()
        script = (
            "const done = arguments[arguments.length - 1];"
            f"{_call_source(fn, arg)}.then((v) => done({{ok: v}}),"
            " (e) => done({err: String(e && e.name ? `${e.name}: ${e.message}` : e)}));"
        )
        result = self.wk.request("POST", "/execute/async", {"script": script, "args": []})
        if "err" in result:
            raise BrowserError(f"webkit: {result['err']}")
        return json.loads(result["ok"])

    def wait_for(self, condition: str, timeout: float = 60) -> None:
        _poll(self, condition, timeout)

    def close(self) -> None:
        self._here()
        self.wk.request("DELETE", "/window")
        self.wk.current = None


class _WebKit:
    """WebKitGTK's MiniBrowser through WebKitWebDriver (W3C WebDriver over HTTP)."""

    name = "webkit"
    current: str | None  # the window handle commands go to (_WebKitPage._here)

    def __init__(self, features: str = WEBKIT_FEATURES, shared_memory: bool = True, timeout: float = 600) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # Safari exposes SharedArrayBuffer on cross-origin isolated pages; WebKitGTK only when told
        env = {k: v for k, v in os.environ.items() if k != "JSC_useSharedArrayBuffer"}
        if shared_memory:
            env["JSC_useSharedArrayBuffer"] = "1"
        self.proc = subprocess.Popen(
            ["xvfb-run", "-a", "WebKitWebDriver", f"--port={port}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.base, self.session, self.current, self.timeout = f"http://127.0.0.1:{port}", None, None, timeout
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    self._http("GET", "/status")
                    break
                except (OSError, BrowserError):
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise BrowserError("WebKitWebDriver did not start") from None
                    time.sleep(0.1)
            caps = {
                "browserName": "MiniBrowser",
                "webkitgtk:browserOptions": {
                    "binary": _minibrowser(),
                    "args": ["--automation"] + ([f"--features={features}"] if features else []),
                },
            }
            self.session = self._http("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]
            self.request("POST", "/timeouts", {"script": timeout * 1000, "pageLoad": timeout * 1000})
            self._first: str | None = self.request("GET", "/window")
        except BaseException:
            self.close()
            raise

    def _http(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body or {}).encode() if method == "POST" else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout + 30) as resp:
                return json.load(resp)["value"]
        except urllib.error.HTTPError as err:
            value = json.load(err).get("value", {})
            raise BrowserError(f"webkit: {value.get('error')}: {value.get('message')}") from None

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        return self._http(method, f"/session/{self.session}{path}", body)

    def new_page(self) -> Page:
        if self._first is not None:
            handle, self._first = self._first, None
        else:
            handle = self.request("POST", "/window/new", {"type": "tab"})["handle"]
        return _WebKitPage(self, handle)

    def close(self) -> None:
        if self.session:
            with contextlib.suppress(Exception):
                self._http("DELETE", f"/session/{self.session}")
            self.session = None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # xvfb-run, Xvfb and the driver
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def open_browser(
    name: str,
    webgpu: bool = True,
    firefox_prefs: dict | None = None,
    webkit_features: str = WEBKIT_FEATURES,
    shared_memory: bool = True,
    timeout: float = 600,
) -> Iterator[Browser]:
    """A headless ``name`` (one of ENGINES) with a fresh profile, closed on exit. Each engine's own switches:
    ``webgpu`` (Chromium); ``firefox_prefs``: preferences (Firefox); ``webkit_features``: MiniBrowser's
    feature switches ("" for its defaults, which leave OPFS and the Storage API off) and ``shared_memory``:
    SharedArrayBuffer on cross-origin isolated pages (WebKit). ``timeout``: seconds one call may take
    (Firefox and WebKit; TimeoutError after it)."""
    why = missing(name)
    if why:
        raise BrowserError(f"cannot start {name}: {why}")
    if name == "chromium":
        browser: Browser = _Chromium(webgpu)
    elif name == "firefox":
        browser = _Firefox(firefox_prefs, timeout)
    else:
        browser = _WebKit(webkit_features, shared_memory, timeout)
    try:
        yield browser
    finally:
        browser.close()


T = TypeVar("T")


def once_more_if_firefox_hangs(name: str, run: Callable[[], T], hang_s: float, say: Callable[[str], None]) -> T:
    """``run()``, which opens its own ``name`` with ``timeout=hang_s``; in Firefox, once more after a
    TimeoutError, saying so. Firefox ESR 153 now and then blocks a worker that starts workers for good,
    and the runtime cannot end every such hang itself (docs/runtime.md, "Browsers")."""
    if name != "firefox":
        return run()
    try:
        return run()
    except TimeoutError:
        say(f"no answer from Firefox in {hang_s:.0f} s (it blocked a worker): once more, in a fresh browser")
        return run()
