// Live updates for the dashboard: a websocket to /ws/live/ carries events with ids
// only; each one is re-dispatched on <body> as "bw-<kind>" (with the event as
// detail) and the panels listening for it refetch themselves through htmx.
// Events of one kind and environment are coalesced: the first starts a window of
// COALESCE_MS and one bw-<kind> fires at its end, however many came meanwhile, so a
// burst costs one refetch per panel and never postpones it.
// Every time a socket opens the page resyncs every panel (bw-resync): nothing
// committed between rendering the page and joining the groups is missed. Until a
// socket is open, and whenever it is lost, the page polls (bw-resync every
// POLL_MS) and reconnects with a jittered backoff. It pings every PING_MS; a
// socket that does not open within OPEN_WAIT_MS or answer within PONG_WAIT_MS is
// dropped at once. A 4401 close means this session signed out: one resync (which
// leads to the login page if the browser is signed out too), then reconnecting
// slowly, for a sign-in in another tab.
// (The page is loaded once; htmx only swaps parts of it, so this runs once.)
(function () {
  "use strict";
  var POLL_MS = 10000, MAX_BACKOFF_MS = 30000, COALESCE_MS = 300;
  var PING_MS = 25000, PONG_WAIT_MS = 10000, OPEN_WAIT_MS = 10000, SIGNED_OUT = 4401;
  var body, url, socket = null, pollTimer = null, backoff = 1000, pending = {};
  var liveText = "connecting";

  function setState(state, text) {
    body.dataset.live = state;
    liveText = text;
    showState();
  }
  function showState() {
    var label = document.querySelector("#live-status .live-text");
    if (label) label.textContent = liveText;
  }
  function fire(name, detail) {
    if (window.htmx) window.htmx.trigger(body, name, detail || {});
  }
  function coalesce(event) {
    var key = event.kind + ":" + event.environment;
    if (pending[key]) return;
    pending[key] = window.setTimeout(function () {
      delete pending[key];
      fire("bw-" + event.kind, event);
      // and by environment, for panels of one environment (an htmx trigger filter
      // would need eval, which the Content-Security-Policy forbids)
      fire("bw-" + event.kind + "-" + event.environment, event);
    }, COALESCE_MS);
  }
  function startPolling() {
    if (pollTimer === null) pollTimer = window.setInterval(function () { fire("bw-resync"); }, POLL_MS);
  }
  function stopPolling() {
    if (pollTimer !== null) { window.clearInterval(pollTimer); pollTimer = null; }
  }
  function reconnectLater(delay) {
    window.setTimeout(connect, delay * (0.5 + Math.random()));  // jitter: no herd
  }
  // Forget `ws` (its handlers and timers) and carry on without it.
  function lost(ws, code) {
    if (ws !== socket) return;
    socket = null;
    window.clearTimeout(ws.openTimer); window.clearInterval(ws.pingTimer);
    window.clearTimeout(ws.pongTimer);
    ws.onopen = ws.onmessage = ws.onclose = null;
    try { ws.close(); } catch (e) { /* already closed */ }
    startPolling();
    if (code === SIGNED_OUT) {
      setState("signed-out", "signed out");
      fire("bw-resync");
      reconnectLater(MAX_BACKOFF_MS);
      return;
    }
    setState("polling", "reconnecting");
    reconnectLater(backoff);
    backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
  }
  function connect() {
    if (socket !== null) return;
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws;
    try {
      ws = new WebSocket(scheme + window.location.host + url);
    } catch (e) {
      setState("polling", "polling"); startPolling(); return;
    }
    socket = ws;
    ws.openTimer = window.setTimeout(function () { lost(ws); }, OPEN_WAIT_MS);
    ws.onopen = function () {
      window.clearTimeout(ws.openTimer);
      stopPolling(); setState("live", "live");
      fire("bw-resync");
      ws.pingTimer = window.setInterval(function () {
        ws.send(JSON.stringify({kind: "ping"}));
        if (!ws.pongTimer) ws.pongTimer = window.setTimeout(function () { lost(ws); }, PONG_WAIT_MS);
      }, PING_MS);
    };
    ws.onmessage = function (message) {
      var event;
      try { event = JSON.parse(message.data); } catch (e) { return; }
      if (!event || !event.kind) return;
      if (event.kind === "pong") {
        window.clearTimeout(ws.pongTimer); ws.pongTimer = null;
        backoff = 1000;  // a socket that answers is a healthy one
      } else if (event.kind !== "hello") {
        coalesce(event);
      }
    };
    ws.onclose = function (closed) { lost(ws, closed.code); };
  }
  // A panel refresh after the session ended is redirected to the login page: go
  // there as a whole page, to come back here, instead of swapping the form in.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr, login = body && body.dataset.loginUrl;
    if (login && xhr && xhr.responseURL && new URL(xhr.responseURL).pathname === login) {
      event.detail.shouldSwap = false;
      window.location.assign(login + "?next=" +
        encodeURIComponent(window.location.pathname + window.location.search));
    }
  });
  // Going back restores a saved copy of the page, header included.
  document.addEventListener("htmx:historyRestore", function () { if (body) showState(); });
  document.addEventListener("DOMContentLoaded", function () {
    body = document.body;
    url = body.dataset.liveUrl;
    if (!url) return;
    startPolling();  // until a socket opens
    if ("WebSocket" in window) connect();
    else setState("polling", "polling");
  });
})();
