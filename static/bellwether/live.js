// Live updates for the dashboard: a websocket to /ws/live/ carries events with ids
// only; each one is re-dispatched on <body> as "bw-<kind>" (with the event as
// detail) and the panels listening for it refetch themselves through htmx.
// Events of one kind and environment are coalesced: the first starts a window of
// COALESCE_MS and one bw-<kind> fires at its end, however many came meanwhile, so a
// burst costs one refetch per panel and never postpones it.
// On every (re)connect the page resyncs every panel (bw-resync): nothing committed
// between rendering the page and joining the groups is missed. While the socket is
// down it polls by sending bw-resync every POLL_MS. It pings every PING_MS; no pong
// within PONG_WAIT_MS means a dead connection, which it replaces. A 4401 close
// means this session signed out: it stops.
// (The page is loaded once; htmx only swaps parts of it, so this runs once.)
(function () {
  "use strict";
  var POLL_MS = 10000, MAX_BACKOFF_MS = 30000, COALESCE_MS = 300;
  var PING_MS = 25000, PONG_WAIT_MS = 10000, SIGNED_OUT = 4401;
  var body, url, socket, pollTimer = null, pingTimer = null, pongTimer = null;
  var backoff = 1000, pending = {};

  function setState(state, text) {
    body.dataset.live = state;
    var label = document.querySelector("#live-status .live-text");
    if (label) label.textContent = text;
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
    }, COALESCE_MS);
  }
  function startPolling() {
    if (pollTimer === null) pollTimer = window.setInterval(function () { fire("bw-resync"); }, POLL_MS);
  }
  function stopPolling() {
    if (pollTimer !== null) { window.clearInterval(pollTimer); pollTimer = null; }
  }
  function stopPinging() {
    window.clearInterval(pingTimer); window.clearTimeout(pongTimer);
    pingTimer = pongTimer = null;
  }
  function ping() {
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    socket.send(JSON.stringify({kind: "ping"}));
    if (pongTimer === null) {
      pongTimer = window.setTimeout(function () { socket.close(); }, PONG_WAIT_MS);
    }
  }
  function connect() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    try {
      socket = new WebSocket(scheme + window.location.host + url);
    } catch (e) {
      setState("polling", "polling"); startPolling(); return;
    }
    socket.onopen = function () {
      backoff = 1000; stopPolling(); setState("live", "live");
      fire("bw-resync");
      pingTimer = window.setInterval(ping, PING_MS);
    };
    socket.onmessage = function (message) {
      var event;
      try { event = JSON.parse(message.data); } catch (e) { return; }
      if (!event || !event.kind) return;
      if (event.kind === "pong") { window.clearTimeout(pongTimer); pongTimer = null; }
      else if (event.kind !== "hello") coalesce(event);
    };
    socket.onclose = function (closed) {
      stopPinging();
      if (closed.code === SIGNED_OUT) { stopPolling(); setState("signed-out", "signed out"); return; }
      setState("polling", "reconnecting"); startPolling();
      window.setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    };
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
  document.addEventListener("DOMContentLoaded", function () {
    body = document.body;
    url = body.dataset.liveUrl;
    if (url && "WebSocket" in window) connect();
    else if (url) { setState("polling", "polling"); startPolling(); }
  });
})();
