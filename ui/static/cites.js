// A citation [n] in the chat shows its paper in the Sources panel, where its passage and the sentences
// that support the claim are (the paper's own link is on the card's title): the card is scrolled to and
// marked for a moment. An earlier answer's cards come back by choosing its turn above the panel first.
(() => {
  const show = (card) => {
    card.scrollIntoView({block: "nearest", behavior: "smooth"});
    card.classList.remove("src-flash");
    void card.offsetWidth;  // restart the animation on a second click
    card.classList.add("src-flash");
  };
  document.addEventListener("click", (e) => {
    const link = e.target.closest ? e.target.closest("a.cite") : null;
    const id = link ? (link.getAttribute("href") || "").replace(/^#/, "") : "";
    if (!/^src-(\d+-)?\d+$/.test(id)) return;
    e.preventDefault();
    e.stopPropagation();
    const card = document.getElementById(id);
    if (card) return show(card);
    const turn = Number(id.split("-").length === 3 ? id.split("-")[1] : 0);
    const pick = document.querySelectorAll("#turn-pick input[type=radio]")[turn - 1];
    if (!pick) return;
    pick.click();
    const started = Date.now();
    const wait = setInterval(() => {
      const shown = document.getElementById(id);
      if (shown || Date.now() - started > 5000) {
        clearInterval(wait);
        if (shown) show(shown);
      }
    }, 100);
  }, true);
})();
