/* The uploads list, enhanced: live filter, selection, confirm/rename dialogs, conversion.
 *
 * Every action here also works without this script (links and forms post to the server,
 * which asks for confirmation itself); the script only keeps people on the page. User
 * strings (file names) are only ever written with textContent, never as HTML.
 */
import { csrfHeaders, csrfToken, problemOf, showDialog, t, visible } from "./common.js";

let refresher = function () {
  return Promise.resolve();
};

/** Fetch this page again and swap in its list (nothing happens on a page without one). */
export function refreshList() {
  return refresher();
}

function init() {
  var root = document.getElementById("file-manager");
  if (!root) {
    return;
  }

  // The conversion states still running, as the server names them.
  var ACTIVE_STATES = (root.getAttribute("data-active-states") || "").split(" ");
  var POLL_MS = 2000;
  var pollTimer = null;

  function revealScriptOnly(scope) {
    scope.querySelectorAll("[data-js-only]").forEach(function (node) {
      node.hidden = false;
    });
  }

  function listPanel() {
    return root.querySelector(".list-panel");
  }

  /* ---- Filter while typing ------------------------------------------------ */

  function applyFilter() {
    var nameInput = document.getElementById("filter-name");
    var typeSelect = document.getElementById("filter-type");
    if (!nameInput || !typeSelect) {
      return;
    }
    var needle = nameInput.value.trim().toLocaleLowerCase();
    var kind = typeSelect.value;
    var shown = 0;
    root.querySelectorAll("tbody.file-group").forEach(function (group) {
      var names = group.getAttribute("data-names").split("\n");
      var kinds = group.getAttribute("data-kinds").split(" ");
      var match = names.some(function (name, index) {
        return name.toLocaleLowerCase().indexOf(needle) !== -1 && (!kind || kinds[index] === kind);
      });
      group.hidden = !match;
      if (match) {
        shown += 1;
      }
    });
    var noMatch = document.getElementById("no-match");
    if (noMatch) {
      noMatch.hidden = shown > 0;
    }
    updateSelection();
  }

  /* ---- Selection and bulk delete ----------------------------------------- */

  function visibleBoxes() {
    return Array.prototype.filter.call(root.querySelectorAll("input.select-file"), function (box) {
      return !box.closest("tbody").hidden;
    });
  }

  function selectedNames() {
    return visibleBoxes()
      .filter(function (box) {
        return box.checked;
      })
      .map(function (box) {
        return box.value;
      });
  }

  function updateSelection() {
    var names = selectedNames();
    var button = document.getElementById("bulk-delete");
    var zipButton = document.getElementById("bulk-zip");
    if (zipButton) {
      zipButton.disabled = names.length === 0;
    }
    var count = document.getElementById("selection-count");
    var all = document.getElementById("select-all");
    if (button) {
      button.disabled = names.length === 0;
    }
    if (count) {
      count.textContent = names.length ? t("selected", { count: names.length }) : "";
    }
    if (all) {
      var boxes = visibleBoxes();
      all.checked = boxes.length > 0 && names.length === boxes.length;
      all.indeterminate = names.length > 0 && names.length < boxes.length;
    }
  }

  /** Show the confirmation dialog naming the files; resolve true when confirmed. */
  function confirmDelete(names) {
    var dialog = document.getElementById("confirm-dialog");
    var list = dialog.querySelector('[data-role="names"]');
    list.replaceChildren();
    names.forEach(function (name) {
      var item = document.createElement("li");
      item.textContent = visible(name);
      list.appendChild(item);
    });
    return showDialog(dialog);
  }

  /** Post a plain form (with the CSRF token), as the no-script path would. */
  function postForm(action, fields) {
    var form = document.createElement("form");
    form.method = "post";
    form.action = action;
    form.hidden = true;
    var all = [["csrf_token", csrfToken]].concat(fields);
    all.forEach(function (pair) {
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = pair[0];
      input.value = pair[1];
      form.appendChild(input);
    });
    document.body.appendChild(form);
    form.submit();
  }

  function deleteFiles(names) {
    var bulkForm = document.getElementById("bulk-form");
    if (!bulkForm || !names.length) {
      return;
    }
    confirmDelete(names).then(function (confirmed) {
      if (!confirmed) {
        return;
      }
      var fields = names.map(function (name) {
        return ["filenames", name];
      });
      fields.push(["confirmed", "yes"]);
      postForm(bulkForm.getAttribute("action"), fields);
    });
  }

  /* ---- Several files as one zip ------------------------------------------ */

  /** Download the selection as one zip (a plain GET; the browser saves it). */
  function downloadZip(url, names) {
    if (!names.length) {
      return;
    }
    var query = names
      .map(function (name) {
        return "filenames=" + encodeURIComponent(name);
      })
      .join("&");
    var link = document.createElement("a");
    link.href = url + "?" + query;
    link.download = "";
    link.hidden = true;
    document.body.appendChild(link);
    link.click();
    link.remove();
  }

  /* ---- Rename ------------------------------------------------------------- */

  function openRename(name) {
    var dialog = document.getElementById("rename-dialog");
    dialog.querySelector('[data-role="filename"]').value = name;
    dialog.querySelector('[data-role="current"]').textContent = visible(name);
    var input = dialog.querySelector('input[name="new_name"]');
    input.value = name;
    dialog.querySelector('[data-role="error"]').hidden = true;
    dialog.showModal();
    var dot = name.lastIndexOf(".");
    input.focus();
    input.setSelectionRange(0, dot > 0 ? dot : name.length);
  }

  /* ---- Conversion --------------------------------------------------------- */

  var STATE_KEYS = { queued: "queued", converting: "converting", done: "done", failed: "convFailed" };

  function rowFor(name) {
    return Array.prototype.find.call(root.querySelectorAll("tr.file-row"), function (row) {
      return row.getAttribute("data-filename") === name;
    });
  }

  function showState(name, state, error) {
    var row = rowFor(name);
    if (!row) {
      return;
    }
    var badge = row.querySelector('[data-role="state"]');
    if (badge) {
      badge.className = "badge conversion-state state-" + state;
      badge.textContent = t(STATE_KEYS[state] || state);
      badge.hidden = !state;
    }
    var message = row.querySelector('[data-role="state-error"]');
    if (error) {
      if (!message) {
        message = document.createElement("span");
        message.className = "hint error-text";
        message.setAttribute("data-role", "state-error");
        badge.parentNode.appendChild(message);
      }
      message.textContent = visible(error);
    }
  }

  function announce(text) {
    var status = document.getElementById("upload-status");
    if (status) {
      status.textContent = text;
    }
  }

  function convert(button) {
    var name = button.getAttribute("data-filename");
    button.disabled = true;
    showState(name, "queued");
    fetch(button.getAttribute("data-url"), {
      method: "POST",
      headers: Object.assign({ Accept: "application/json" }, csrfHeaders()),
      credentials: "same-origin",
    })
      .then(
        function (response) {
          return response
            .json()
            .catch(function () {
              return null;
            })
            .then(function (body) {
              if (!response.ok) {
                throw new Error(problemOf(response.status, body));
              }
              return body || {};
            });
        },
        function () {
          throw new Error(problemOf(0, null));
        }
      )
      .then(function (body) {
        if (ACTIVE_STATES.indexOf(body.conversion_state) !== -1) {
          showState(name, body.conversion_state);
          startPolling();
        } else {
          reloadList();
        }
      })
      .catch(function (error) {
        button.disabled = false;
        showState(name, "failed", error.message);
        announce(t("convertError", { name: name, detail: error.message }));
      });
  }

  function pollOnce() {
    fetch(root.getAttribute("data-list-url"), {
      headers: { Accept: "application/json" },
      credentials: "same-origin",
    })
      .then(function (response) {
        return response.ok ? response.json() : null;
      })
      .then(function (body) {
        if (!body) {
          return;
        }
        var pending = false;
        body.files.forEach(function (file) {
          var state = file.conversion_state;
          if (ACTIVE_STATES.indexOf(state) !== -1) {
            pending = true;
            showState(file.filename, state);
          }
        });
        if (!pending) {
          stopPolling();
          reloadList();
        }
      })
      .catch(function () {
        /* a missed poll is retried on the next tick */
      });
  }

  function startPolling() {
    if (pollTimer === null) {
      pollTimer = window.setInterval(pollOnce, POLL_MS);
    }
  }

  function stopPolling() {
    if (pollTimer !== null) {
      window.clearInterval(pollTimer);
      pollTimer = null;
    }
  }

  /* ---- Refresh the list without leaving the page ------------------------- */

  /** Fetch this page again and swap in its list, keeping the filter typed so far. */
  function reloadList() {
    return fetch(root.getAttribute("data-page-url"), { credentials: "same-origin" })
      .then(function (response) {
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        // The header's storage usage changed with the list (an upload, a delete).
        var freshUsage = fresh.getElementById("storage-usage");
        var oldUsage = document.getElementById("storage-usage");
        if (freshUsage && oldUsage) {
          oldUsage.replaceWith(document.importNode(freshUsage, true));
        }
        var freshPanel = fresh.querySelector(".list-panel");
        var freshRoot = fresh.getElementById("file-manager");
        var oldPanel = listPanel();
        if (!freshPanel || !oldPanel) {
          return;
        }
        var nameInput = document.getElementById("filter-name");
        var typed = nameInput ? nameInput.value : null;
        var adopted = document.importNode(freshPanel, true);
        oldPanel.replaceWith(adopted);
        revealScriptOnly(adopted);
        var newInput = document.getElementById("filter-name");
        if (newInput && typed !== null) {
          newInput.value = typed;
        }
        applyFilter();
        if (freshRoot && freshRoot.getAttribute("data-pending") === "true") {
          startPolling();
        }
      });
  }

  /* ---- Wiring (delegated, so a refreshed list needs no re-binding) -------- */

  document.addEventListener("click", function (event) {
    var target = event.target.closest("[data-action]");
    if (!target || !root.contains(target)) {
      return;
    }
    var action = target.getAttribute("data-action");
    var name = target.getAttribute("data-filename");
    if (action === "delete") {
      event.preventDefault();
      deleteFiles([name]);
    } else if (action === "rename") {
      event.preventDefault();
      openRename(name);
    } else if (action === "row-menu") {
      event.preventDefault();
      var row = target.closest("tr");
      var open = !row.classList.contains("menu-open");
      row.classList.toggle("menu-open", open);
      target.setAttribute("aria-expanded", open ? "true" : "false");
    } else if (action === "zip-selected") {
      event.preventDefault();
      downloadZip(target.getAttribute("data-url"), selectedNames());
    } else if (action === "convert") {
      event.preventDefault();
      convert(target);
    }
  });

  document.addEventListener("change", function (event) {
    if (event.target.id === "select-all") {
      var checked = event.target.checked;
      visibleBoxes().forEach(function (box) {
        box.checked = checked;
      });
      updateSelection();
    } else if (event.target.classList.contains("select-file")) {
      updateSelection();
    } else if (event.target.id === "filter-type") {
      applyFilter();
    }
  });

  document.addEventListener("input", function (event) {
    if (event.target.id === "filter-name") {
      applyFilter();
    }
  });

  document.addEventListener("submit", function (event) {
    if (event.target.id === "bulk-form" && !(event.submitter && event.submitter.id === "share-create")) {
      event.preventDefault();
      deleteFiles(selectedNames());
    }
  });

  var renameDialog = document.getElementById("rename-dialog");
  if (renameDialog) {
    renameDialog.querySelector('[data-role="cancel"]').addEventListener("click", function () {
      renameDialog.close();
    });
    renameDialog.querySelector("form").addEventListener("submit", function (event) {
      event.preventDefault();
      submitRename(renameDialog);
    });
  }

  /** Rename through the JSON API; a refusal (a taken name) is shown in the dialog, which
   * stays open with what was typed, so the person can pick another name or choice. */
  function submitRename(dialog) {
    var form = dialog.querySelector("form");
    var error = dialog.querySelector('[data-role="error"]');
    var old = dialog.querySelector('[data-role="filename"]').value;
    var newName = form.querySelector('input[name="new_name"]').value;
    var choice = form.querySelector('select[name="on_conflict"]').value;
    var url = root.getAttribute("data-rename-url").replace("__name__", encodeURIComponent(old));
    error.hidden = true;
    fetch(url, {
      method: "POST",
      headers: Object.assign(
        { Accept: "application/json", "Content-Type": "application/json" },
        csrfHeaders()
      ),
      credentials: "same-origin",
      body: JSON.stringify({ new_name: newName, on_conflict: choice }),
    })
      .then(
        function (response) {
          return response
            .json()
            .catch(function () {
              return null;
            })
            .then(function (body) {
              if (response.status === 409) {
                throw new Error(t("renameTaken", { name: newName }));
              }
              if (!response.ok) {
                throw new Error(problemOf(response.status, body));
              }
              return body;
            });
        },
        function () {
          throw new Error(problemOf(0, null));
        }
      )
      .then(function (body) {
        dialog.close();
        var renamed = body && body.file ? body.file.filename : newName;
        return reloadList().then(function () {
          announce(t("renamed", { old: visible(old), new: visible(renamed) }));
        });
      })
      .catch(function (problem) {
        error.textContent = problem.message;
        error.hidden = false;
        form.querySelector('input[name="new_name"]').focus();
      });
  }

  /* ---- Keyboard shortcuts (never while typing in a field or with a dialog open) --- */

  var cursor = null; // the row the arrows moved to (its file name)

  function visibleRows() {
    return Array.prototype.filter.call(root.querySelectorAll("tr.file-row"), function (row) {
      return !row.closest("tbody").hidden;
    });
  }

  function cursorRow() {
    return cursor === null ? null : rowFor(cursor);
  }

  function moveCursor(step) {
    var rows = visibleRows();
    if (!rows.length) {
      return;
    }
    var current = cursorRow();
    var index = current ? rows.indexOf(current) : -1;
    var next = rows[Math.max(0, Math.min(rows.length - 1, index === -1 ? 0 : index + step))];
    rows.forEach(function (row) {
      row.classList.remove("cursor");
    });
    next.classList.add("cursor");
    cursor = next.getAttribute("data-filename");
    var link = next.querySelector("a.file-name");
    if (link) {
      link.focus({ preventScroll: true });
    }
    next.scrollIntoView({ block: "nearest" });
  }

  function typing(target) {
    if (!target || !target.closest) {
      return false;
    }
    return Boolean(
      target.closest("input, textarea, select, [contenteditable=''], [contenteditable='true']")
    );
  }

  function dialogOpen() {
    return document.querySelector("dialog[open]") !== null;
  }

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) {
      return;
    }
    if (typing(event.target) || dialogOpen()) {
      return;
    }
    var key = event.key;
    var row = cursorRow();
    if (key === "/") {
      var filter = document.getElementById("filter-name");
      if (filter) {
        event.preventDefault();
        filter.focus();
        filter.select();
      }
    } else if (key === "ArrowDown" || key === "ArrowUp") {
      event.preventDefault();
      moveCursor(key === "ArrowDown" ? 1 : -1);
    } else if (key === "Enter" && row) {
      event.preventDefault();
      window.location.href = row.querySelector("a.file-name").href;
    } else if (key === "Delete" && (row || selectedNames().length)) {
      event.preventDefault();
      deleteFiles(selectedNames().length ? selectedNames() : [cursor]);
    } else if (key === "F2" && row) {
      event.preventDefault();
      openRename(cursor);
    } else if (key === "?") {
      var help = document.getElementById("shortcuts-dialog");
      if (help) {
        event.preventDefault();
        help.showModal();
      }
    } else if (key === "Escape" && row) {
      row.classList.remove("cursor");
      cursor = null;
    }
  });

  revealScriptOnly(document);
  applyFilter();
  if (root.getAttribute("data-pending") === "true") {
    startPolling();
  }

  refresher = reloadList;
}

init();
