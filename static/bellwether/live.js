// Live updates for the dashboard: a websocket to /ws/live/ carries events with ids
// only; each one is re-dispatched on <body> as "bw-<kind>" (with the event as
// detail) and the panels listening for it refetch themselves through htmx. On
// every (re)connect the page resyncs (bw-resync); while the socket is down it
// polls by sending bw-resync every POLL_MS. A 4401 close means signed out.
// (The page is loaded once; htmx only swaps parts of it, so this runs once.)
(function () {
  "use strict";
  var POLL_MS = 10000, MAX_BACKOFF_MS = 30000, SIGNED_OUT = 4401;
  var body, url, socket, pollTimer = null, backoff = 1000, connectedOnce = false;

  function setState(state, text) {
    body.dataset.live = state;
    var label = document.querySelector("#live-status .live-text");
    if (label) label.textContent = text;
  }
  function fire(name, detail) {
    if (window.htmx) window.htmx.trigger(body, name, detail || {});
  }
  function startPolling() {
    if (pollTimer === null) pollTimer = window.setInterval(function () { fire("bw-resync"); }, POLL_MS);
  }
  function stopPolling() {
    if (pollTimer !== null) { window.clearInterval(pollTimer); pollTimer = null; }
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
      if (connectedOnce) fire("bw-resync");  // events may have been missed meanwhile
      connectedOnce = true;
    };
    socket.onmessage = function (message) {
      var event;
      try { event = JSON.parse(message.data); } catch (e) { return; }
      if (event && event.kind && event.kind !== "hello" && event.kind !== "pong") {
        fire("bw-" + event.kind, event);
      }
    };
    socket.onclose = function (closed) {
      if (closed.code === SIGNED_OUT) { stopPolling(); setState("signed-out", "signed out"); return; }
      setState("polling", "reconnecting"); startPolling();
      window.setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    };
  }
  // A panel refresh after the session ended is redirected to the login page: go
  // there as a whole page instead of swapping the form into the panel.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr, login = body && body.dataset.loginUrl;
    if (login && xhr && xhr.responseURL &&
        new URL(xhr.responseURL).pathname === login) {
      event.detail.shouldSwap = false;
      window.location.assign(xhr.responseURL);
    }
  });
  document.addEventListener("DOMContentLoaded", function () {
    body = document.body;
    url = body.dataset.liveUrl;
    if (url && "WebSocket" in window) connect();
    else if (url) { setState("polling", "polling"); startPolling(); }
  });
})();
