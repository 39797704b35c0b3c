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
