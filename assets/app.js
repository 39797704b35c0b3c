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
