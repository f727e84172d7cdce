/* The share-link page: copy the new link to the clipboard (it is shown only once). */
import { t } from "./common.js";

function init() {
  var button = document.getElementById("copy-share-url");
  var field = document.getElementById("share-url");
  var status = document.getElementById("copy-status");
  if (!button || !field) {
    return;
  }
  button.hidden = false;
  field.addEventListener("focus", function () {
    field.select();
  });
  button.addEventListener("click", function () {
    field.select();
    var copied = navigator.clipboard
      ? navigator.clipboard.writeText(field.value)
      : Promise.reject(new Error("no clipboard"));
    copied.then(
      function () {
        status.textContent = t("copied");
      },
      function () {
        status.textContent = t("copyFailed");
      }
    );
  });
}

init();
