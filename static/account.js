/* The account page's Copy button: puts the new API token on the clipboard. */
(function () {
  "use strict";
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var input = document.getElementById(button.getAttribute("data-copy"));
      if (!input) return;
      input.select();
      var done = function () {
        button.textContent = button.getAttribute("data-copied");
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(input.value).then(done, function () {});
      } else {
        try {
          if (document.execCommand("copy")) done();
        } catch (error) {
          /* the token stays selected for a manual copy */
        }
      }
    });
  });
})();
