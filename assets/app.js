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
