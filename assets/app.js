// fastrtc's component preloads a sound from another host; the page only loads what its own server serves.
(() => {
  const Native = window.Audio;
  window.Audio = function (src) {
    const foreign = typeof src === "string" && /^https?:/.test(src) && !src.startsWith(location.origin);
    return new Native(foreign ? undefined : src);
  };
  window.Audio.prototype = Native.prototype;
})();
// Keeps the transcript scrolled to the newest line while the user has not scrolled up.
(() => {
  const stick = () => {
    const box = document.getElementById("rt-transcript");
    if (!box || box.dataset.rtBound) return;
    box.dataset.rtBound = "1";
    let pinned = true;
    box.addEventListener("scroll", () => {
      pinned = box.scrollTop + box.clientHeight >= box.scrollHeight - 24;
    });
    new MutationObserver(() => { if (pinned) box.scrollTop = box.scrollHeight; })
      .observe(box, { childList: true, subtree: true, characterData: true });
  };
  new MutationObserver(stick).observe(document.documentElement, { childList: true, subtree: true });
})();
// Browsers give the microphone only to https pages and localhost: say so instead of failing silently.
(() => {
  if (window.isSecureContext) return;
  const tell = () => {
    const box = document.getElementById("rt-notice");
    if (!box) return false;
    box.insertAdjacentHTML("afterbegin", '<div class="rt-notice" role="alert">This page was opened over plain ' +
      "http from another machine, so the browser will not give it the microphone. Open it over https (or on " +
      "localhost).</div>");
    return true;
  };
  const watch = new MutationObserver(() => { if (tell()) watch.disconnect(); });
  watch.observe(document.documentElement, { childList: true, subtree: true });
})();
// ?view=captions: the same page styled as large captions of the last lines (assets/style.css, .rt-captions).
(() => {
  if (new URLSearchParams(location.search).get("view") === "captions") {
    document.documentElement.classList.add("rt-captions");
  }
})();
// Short messages for screen readers and sighted users alike (the copy button's answer).
window.rtSay = (text) => {
  let box = document.getElementById("rt-say");
  if (!box) {
    box = document.createElement("div");
    box.id = "rt-say";
    box.setAttribute("role", "status");
    box.setAttribute("aria-live", "polite");
    document.body.appendChild(box);
  }
  box.textContent = text;
  box.classList.add("rt-shown");
  clearTimeout(window.rtSayTimer);
  window.rtSayTimer = setTimeout(() => box.classList.remove("rt-shown"), 2500);
};
// A connection that drops (server gone, network lost) says so; the transcript on the page stays as it was.
// A stop the user asked for closes the connection, which fires no state change, so it says nothing.
(() => {
  const Native = window.RTCPeerConnection;
  if (!Native) return;
  const say = (html) => {
    const box = document.getElementById("rt-connection");
    if (box) box.innerHTML = html;
  };
  window.RTCPeerConnection = function (...args) {
    const pc = new Native(...args);
    pc.addEventListener("connectionstatechange", () => {
      const state = pc.connectionState;
      if (state === "disconnected" || state === "failed") {
        say('<div class="rt-dropped" role="alert">The connection to the server dropped. The transcript so far is ' +
          "kept below (Copy text still works); press Record to carry on once the server is back.</div>");
      } else if (state === "connected") {
        say("");
      }
    });
    return pc;
  };
  window.RTCPeerConnection.prototype = Native.prototype;
})();
