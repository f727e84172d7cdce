/* The uploads list, enhanced: live filter, selection, confirm/rename dialogs, conversion.
 *
 * Every action here also works without this script (links and forms post to the server,
 * which asks for confirmation itself); the script only keeps people on the page. User
 * strings (file names) are only ever written with textContent, never as HTML.
 */
(function () {
  "use strict";

  var root = document.getElementById("file-manager");
  if (!root) {
    return;
  }

  var stringsNode = document.getElementById("js-strings");
  var strings = stringsNode ? JSON.parse(stringsNode.textContent) : {};
  var csrfMeta = document.querySelector('meta[name="csrf-token"]');
  var csrfToken = csrfMeta ? csrfMeta.getAttribute("content") : "";

  /**
   * Headers that let a signed-in page change things through the JSON API: the form token,
   * and (with accounts on) the `csrf_token` cookie echoed in X-CSRF-Token, read on every
   * call because the server may renew it.
   */
  function csrfHeaders() {
    var headers = { "X-CSRFToken": csrfToken };
    var match = document.cookie.match(/(?:^|;\s*)csrf_token=([^;]*)/);
    if (match) {
      headers["X-CSRF-Token"] = decodeURIComponent(match[1]);
    }
    return headers;
  }
  var POLL_MS = 2000;
  var pollTimer = null;

  /** A translated string with {placeholders} filled in. */
  function t(key, params) {
    var text = strings[key] || key;
    Object.keys(params || {}).forEach(function (name) {
      text = text.split("{" + name + "}").join(String(params[name]));
    });
    return text;
  }

  /** Sizes exactly as the server writes them (SPEC 2.7): B, then KiB/MiB/GiB, one decimal. */
  function formatSize(size) {
    if (size < 1024) {
      return size + " B";
    }
    var units = ["KiB", "MiB", "GiB"];
    var value = size / 1024;
    var index = 0;
    while (value >= 1024 && index < units.length - 1) {
      value /= 1024;
      index += 1;
    }
    var text = value.toFixed(1);
    if (text.slice(-2) === ".0") {
      text = text.slice(0, -2);
    }
    return text + " " + units[index];
  }

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
      item.textContent = name;
      list.appendChild(item);
    });
    return new Promise(function (resolve) {
      dialog.addEventListener(
        "close",
        function () {
          resolve(dialog.returnValue === "confirm");
        },
        { once: true }
      );
      dialog.returnValue = "";
      dialog.showModal();
    });
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

  /* ---- Rename ------------------------------------------------------------- */

  function openRename(name) {
    var dialog = document.getElementById("rename-dialog");
    dialog.querySelector('[data-role="filename"]').value = name;
    dialog.querySelector('[data-role="current"]').textContent = name;
    var input = dialog.querySelector('input[name="new_name"]');
    input.value = name;
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
      message.textContent = error;
    }
  }

  function announce(text) {
    var status = document.getElementById("upload-status");
    if (status) {
      status.textContent = text;
    }
  }

  function detailOf(body, fallback) {
    if (body && typeof body.detail === "string") {
      return body.detail;
    }
    if (body && Array.isArray(body.detail) && body.detail.length && body.detail[0].msg) {
      return body.detail[0].msg;
    }
    return fallback;
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
      .then(function (response) {
        return response
          .json()
          .catch(function () {
            return null;
          })
          .then(function (body) {
            if (response.status === 404 || response.status === 405) {
              if (!body || !body.detail || body.detail === "Not Found") {
                throw new Error(t("convertUnavailable"));
              }
            }
            if (!response.ok) {
              throw new Error(detailOf(body, response.statusText));
            }
            return body || {};
          });
      })
      .then(function (body) {
        if (body.conversion_state === "queued" || body.conversion_state === "converting") {
          showState(name, body.conversion_state);
          startPolling();
        } else {
          refreshList();
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
          if (state === "queued" || state === "converting") {
            pending = true;
            showState(file.filename, state);
          }
        });
        if (!pending) {
          stopPolling();
          refreshList();
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
  function refreshList() {
    return fetch(root.getAttribute("data-page-url"), { credentials: "same-origin" })
      .then(function (response) {
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
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
    if (event.target.id === "bulk-form") {
      event.preventDefault();
      deleteFiles(selectedNames());
    }
  });

  var renameDialog = document.getElementById("rename-dialog");
  if (renameDialog) {
    renameDialog.querySelector('[data-role="cancel"]').addEventListener("click", function () {
      renameDialog.close();
    });
  }

  revealScriptOnly(document);
  applyFilter();
  if (root.getAttribute("data-pending") === "true") {
    startPolling();
  }

  window.DeerflowFiles = {
    t: t,
    formatSize: formatSize,
    refreshList: refreshList,
    detailOf: detailOf,
    csrfToken: csrfToken,
    csrfHeaders: csrfHeaders,
  };
})();
