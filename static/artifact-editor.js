/* The editor of a text file under outputs/ on its preview page.
 *
 * Saves with DeerFlow's request (PUT on the artifact URL, {content, expected_sha256}); the
 * hash is the version this page opened, then the version it last saved, so a file an agent
 * rewrote meanwhile is never overwritten: the server answers 412 and the page says so.
 */

import { csrfHeaders } from "./common.js";
import { detailOf } from "./common.js";
import { formatSize } from "./common.js";
import { t } from "./common.js";

const root = document.getElementById("artifact-editor");
if (root) {
  const text = document.getElementById("editor-text");
  const save = document.getElementById("editor-save");
  const status = document.getElementById("editor-status");
  const reload = document.getElementById("editor-reload");
  let sha256 = root.dataset.sha256;

  save.addEventListener("click", async function () {
    save.disabled = true;
    reload.hidden = true;
    status.textContent = t("saving");
    try {
      const response = await fetch(root.dataset.url, {
        method: "PUT",
        credentials: "same-origin",
        headers: Object.assign({ "Content-Type": "application/json" }, csrfHeaders()),
        body: JSON.stringify({ content: text.value, expected_sha256: sha256 }),
      });
      const body = await response.json().catch(function () {
        return null;
      });
      if (response.ok) {
        sha256 = body.sha256;
        status.textContent = t("saved", { size: formatSize(body.size) });
      } else if (response.status === 412) {
        status.textContent = t("changed");
        reload.hidden = false;
      } else {
        status.textContent = t("saveFailed", {
          detail: detailOf(body, response.status + " " + response.statusText),
        });
      }
    } catch (error) {
      status.textContent = t("networkError");
    } finally {
      save.disabled = false;
    }
  });
}
