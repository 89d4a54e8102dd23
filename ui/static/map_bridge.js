(() => {
  let state = {cited: [], retrieved: [], question: ""}, last = "";
  const frame = () => document.getElementById("map-frame");
  const post = (target) => target && target.postMessage(
    Object.assign({type: "rag-map-highlight"}, state), location.origin);
  const read = () => {
    const panel = document.querySelector("#sources .src-panel");
    try { return Object.assign({cited: [], retrieved: [], question: ""}, JSON.parse(panel.dataset.map)); }
    catch (e) { return {cited: [], retrieved: [], question: ""}; }
  };
  const sync = () => {
    const next = read(), key = JSON.stringify(next);
    if (key === last) return;
    state = next; last = key;
    const f = frame();
    post(f && f.contentWindow);
  };
  new MutationObserver(sync).observe(document.documentElement, {subtree: true, childList: true});
  window.addEventListener("message", (e) => {
    const f = frame();
    if (e.origin !== location.origin || !f || e.source !== f.contentWindow) return;
    if (e.data && e.data.type === "rag-map-ready") { sync(); post(e.source); }
  });
})();
