/* Light or dark pages: the system's choice (prefers-color-scheme) until the person picks
 * one with the header's toggle, which is remembered. A classic script in <head>, so the
 * chosen theme is set before the first paint (no flash of the other one). */
(function () {
  var KEY = "deerflow-web.theme";
  var root = document.documentElement;
  var chosen = null;
  try {
    chosen = window.localStorage.getItem(KEY);
  } catch (error) {
    chosen = null;
  }
  if (chosen === "dark" || chosen === "light") {
    root.setAttribute("data-theme", chosen);
  }

  function current() {
    var explicit = root.getAttribute("data-theme");
    if (explicit) {
      return explicit;
    }
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  function label(button) {
    var dark = current() === "dark";
    button.setAttribute("aria-pressed", dark ? "true" : "false");
  }

  document.addEventListener("DOMContentLoaded", function () {
    var button = document.getElementById("theme-toggle");
    if (!button) {
      return;
    }
    button.hidden = false;
    label(button);
    button.addEventListener("click", function () {
      var next = current() === "dark" ? "light" : "dark";
      root.setAttribute("data-theme", next);
      try {
        window.localStorage.setItem(KEY, next);
      } catch (error) {
        /* applied, not remembered */
      }
      label(button);
    });
  });
})();
