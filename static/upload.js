/* Uploads with a drop zone, client-side limit checks, a name-conflict prompt and progress.
 *
 * The form works without this script (it posts to the page, which redirects back). With
 * it, files go to the JSON API (`POST .../uploads`) through XMLHttpRequest, whose upload
 * progress events drive the bars. The limits are the server's own (GET .../uploads/limits)
 * and are checked in selection order as DeerFlow's client does (SPEC 2.7), so a file that
 * would be refused is explained before a single byte is sent. The server stays the judge:
 * naming, numbering and storage rules are never re-implemented here. Files above the
 * resumable threshold go through resumable.js (tus) one by one instead, each its own upload,
 * so the per-request count and total limits do not apply to them.
 */
import { formatSize, problemOf, setCsrfHeaders, showDialog, t } from "./common.js";
import { refreshList } from "./files.js";
import { resumableUploads } from "./resumable.js";

function init() {
  var root = document.getElementById("file-manager");
  var form = document.getElementById("upload-form");
  var resumable = resumableUploads(root);
  if (!root || !form) {
    return;
  }

  var input = document.getElementById("file-input");
  var zone = document.getElementById("drop-zone");
  var queue = document.getElementById("upload-queue");
  var problemsBox = document.getElementById("upload-problems");
  var uploadButton = document.getElementById("upload-button");
  var clearButton = document.getElementById("clear-button");
  var cancelButton = document.getElementById("cancel-button");
  var totalBox = document.getElementById("total-progress");
  var totalBar = document.getElementById("total-progress-bar");
  var totalText = document.getElementById("total-progress-text");
  var status = document.getElementById("upload-status");
  var conflictField = document.getElementById("conflict-field");

  var pending = []; // {file, problem, item, bar, cancel}
  var limits = null;
  var busy = false;
  var currentRequest = null;
  var cancelled = false;

  // The script asks about each taken name instead; the no-script choice is not needed.
  if (conflictField) {
    conflictField.hidden = true;
  }
  input.removeAttribute("required");
  render();

  fetch(root.getAttribute("data-limits-url"), { credentials: "same-origin" })
    .then(function (response) {
      return response.ok ? response.json() : null;
    })
    .then(function (body) {
      limits = body;
      check();
    })
    .catch(function () {
      limits = null; // the server still enforces every limit
    });

  /* ---- Choosing files ------------------------------------------------------ */

  function isAppBundle(file) {
    return /\.app$/i.test(file.name) && (!file.type || file.type === "application/octet-stream");
  }

  function isResumable(entry) {
    return resumable !== null && resumable.wants(entry.file);
  }

  function addFiles(fileList) {
    if (busy) {
      return;
    }
    Array.prototype.forEach.call(fileList, function (file) {
      pending.push({ file: file, problem: null, item: null, bar: null });
    });
    status.textContent = "";
    render();
  }

  /** SPEC 2.7: in selection order, per file, then count, then running total. */
  function check() {
    var count = 0;
    var total = 0;
    pending.forEach(function (entry) {
      var file = entry.file;
      entry.problem = null;
      if (isAppBundle(file)) {
        entry.problem = t("appBundle", { name: file.name });
      } else if (limits && file.size > limits.max_file_size) {
        entry.problem = t("limitFile", {
          name: file.name,
          size: formatSize(file.size),
          max: formatSize(limits.max_file_size),
        });
      } else if (isResumable(entry)) {
        return; // its own upload: the per-request limits do not apply
      } else if (limits && count >= limits.max_files) {
        entry.problem = t("limitCount", { name: file.name, max: limits.max_files });
      } else if (limits && total + file.size > limits.max_total_size) {
        entry.problem = t("limitTotal", {
          name: file.name,
          size: formatSize(total + file.size),
          max: formatSize(limits.max_total_size),
        });
      } else {
        count += 1;
        total += file.size;
      }
    });
    renderProblems();
    return pending.every(function (entry) {
      return entry.problem === null;
    });
  }

  function renderProblems() {
    var problems = pending.filter(function (entry) {
      return entry.problem !== null;
    });
    problemsBox.replaceChildren();
    problemsBox.hidden = problems.length === 0;
    if (!problems.length) {
      return;
    }
    var list = document.createElement("ul");
    problems.forEach(function (entry) {
      var item = document.createElement("li");
      item.textContent = entry.problem;
      list.appendChild(item);
    });
    var note = document.createElement("p");
    note.textContent = t("nothingSent");
    problemsBox.appendChild(list);
    problemsBox.appendChild(note);
    pending.forEach(function (entry) {
      if (entry.item) {
        entry.item.classList.toggle("bad", entry.problem !== null);
        entry.item.querySelector(".problem").textContent = entry.problem || "";
      }
    });
  }

  function render() {
    queue.replaceChildren();
    queue.hidden = pending.length === 0;
    clearButton.hidden = pending.length === 0;
    pending.forEach(function (entry, index) {
      var item = document.createElement("li");
      item.className = "upload-item";
      var name = document.createElement("span");
      name.className = "name";
      name.textContent = entry.file.name;
      var size = document.createElement("span");
      size.className = "size";
      size.textContent = formatSize(entry.file.size);
      var remove = document.createElement("button");
      remove.type = "button";
      remove.className = "button remove";
      remove.textContent = "×";
      remove.setAttribute("aria-label", t("remove", { name: entry.file.name }));
      remove.addEventListener("click", function () {
        pending.splice(index, 1);
        render();
      });
      var bar = document.createElement("progress");
      bar.max = Math.max(entry.file.size, 1);
      bar.value = 0;
      bar.setAttribute("aria-label", entry.file.name);
      var problem = document.createElement("span");
      problem.className = "problem";
      var head = document.createElement("span");
      head.className = "name-line";
      head.appendChild(name);
      head.appendChild(document.createTextNode(" "));
      head.appendChild(size);
      item.appendChild(head);
      item.appendChild(remove);
      item.appendChild(bar);
      item.appendChild(problem);
      entry.item = item;
      entry.bar = bar;
      if (isResumable(entry)) {
        resumable.decorate(entry);
      }
      queue.appendChild(item);
    });
    check();
  }

  /* ---- Start at once, or let the person review first (remembered) ------------- */

  var REVIEW_KEY = "deerflow-web.review-uploads";
  var reviewBox = document.getElementById("review-first");

  function reviewFirst() {
    return reviewBox !== null && reviewBox.checked;
  }

  if (reviewBox) {
    try {
      reviewBox.checked = window.localStorage.getItem(REVIEW_KEY) === "yes";
    } catch (error) {
      /* storage refused: the default (upload at once) holds */
    }
    reviewBox.addEventListener("change", function () {
      try {
        window.localStorage.setItem(REVIEW_KEY, reviewBox.checked ? "yes" : "no");
      } catch (error) {
        /* not remembered, still applied */
      }
      uploadButton.hidden = !reviewBox.checked && !pending.length;
    });
    uploadButton.hidden = !reviewBox.checked;
  }

  /** Files chosen, dropped or pasted: listed, then sent unless the person asked to review. */
  function picked(fileList) {
    if (busy) {
      return;
    }
    addFiles(fileList);
    if (reviewFirst()) {
      uploadButton.hidden = false;
      return;
    }
    start();
  }

  input.addEventListener("change", function () {
    picked(input.files);
    input.value = ""; // the files are kept in `pending`; the same file can be chosen again
  });

  clearButton.addEventListener("click", function () {
    pending = [];
    problemsBox.hidden = true;
    render();
  });

  /* ---- Dropping anywhere on the page, pasting --------------------------------- */

  function carriesFiles(event) {
    var types = event.dataTransfer ? Array.prototype.slice.call(event.dataTransfer.types) : [];
    return types.indexOf("Files") !== -1;
  }

  // The whole page takes a drop (not only the zone): the zone lights up while files hover
  // anywhere, and a file let go beside it is taken, never opened by the browser instead.
  var dragDepth = 0;
  document.addEventListener("dragenter", function (event) {
    if (!carriesFiles(event)) {
      return;
    }
    event.preventDefault();
    dragDepth += 1;
    zone.classList.add("dragover");
    document.body.classList.add("dragging-files");
  });
  document.addEventListener("dragover", function (event) {
    if (carriesFiles(event)) {
      event.preventDefault();
      event.dataTransfer.dropEffect = busy ? "none" : "copy";
    }
  });
  document.addEventListener("dragleave", function (event) {
    if (!carriesFiles(event)) {
      return;
    }
    dragDepth = Math.max(0, dragDepth - 1);
    if (dragDepth === 0) {
      zone.classList.remove("dragover");
      document.body.classList.remove("dragging-files");
    }
  });
  document.addEventListener("drop", function (event) {
    dragDepth = 0;
    zone.classList.remove("dragover");
    document.body.classList.remove("dragging-files");
    if (!event.dataTransfer || !event.dataTransfer.files.length) {
      return;
    }
    event.preventDefault();
    picked(event.dataTransfer.files);
  });

  /** A pasted screenshot arrives as `image.png`: give it a name that says when it came. */
  function pastedName(file) {
    if (!/^image\.[a-z0-9]+$/i.test(file.name)) {
      return file;
    }
    var stamp = new Date().toISOString().slice(0, 19).replace(/[-:]/g, "").replace("T", "-");
    var extension = file.name.slice(file.name.lastIndexOf("."));
    return new File([file], "pasted-" + stamp + extension, { type: file.type });
  }

  document.addEventListener("paste", function (event) {
    var data = event.clipboardData;
    if (!data || !data.files || !data.files.length) {
      return; // text pastes into fields as usual
    }
    event.preventDefault();
    picked(Array.prototype.map.call(data.files, pastedName));
  });

  /* ---- Name conflicts --------------------------------------------------------- */

  function existingNames() {
    return fetch(root.getAttribute("data-list-url"), {
      headers: { Accept: "application/json" },
      credentials: "same-origin",
    })
      .then(
        function (response) {
          return response.ok ? response.json() : { files: [] };
        },
        function () {
          throw new Error(problemOf(0, null));
        }
      )
      .then(function (body) {
        return new Set(
          body.files.map(function (file) {
            return file.filename;
          })
        );
      });
  }

  /** Ask replace / keep both / skip for each taken name; resolve a Map or null (cancel). */
  function askConflicts(conflicts) {
    if (!conflicts.length) {
      return Promise.resolve(new Map());
    }
    var dialog = document.getElementById("conflict-dialog");
    var box = dialog.querySelector('[data-role="choices"]');
    var template = dialog.querySelector('[data-role="choice-template"]');
    box.replaceChildren();
    conflicts.forEach(function (entry, index) {
      var fieldset = template.content.firstElementChild.cloneNode(true);
      fieldset.querySelector('[data-role="name"]').textContent = entry.file.name;
      fieldset.querySelectorAll("input").forEach(function (radio) {
        radio.name = "conflict-" + index;
      });
      box.appendChild(fieldset);
    });
    return showDialog(dialog).then(function (confirmed) {
      if (!confirmed) {
        return null;
      }
      var choices = new Map();
      conflicts.forEach(function (entry, index) {
        var checked = box.querySelector('input[name="conflict-' + index + '"]:checked');
        choices.set(entry, checked ? checked.value : "replace");
      });
      return choices;
    });
  }

  /* ---- Sending ------------------------------------------------------------------ */

  function setBusy(value) {
    busy = value;
    uploadButton.disabled = value;
    clearButton.disabled = value;
    input.disabled = value;
    cancelButton.hidden = !value;
  }

  function showTotal(loaded, total) {
    totalBox.hidden = false;
    totalBar.max = Math.max(total, 1);
    totalBar.value = loaded;
    totalText.textContent = t("progressOf", {
      loaded: formatSize(loaded),
      total: formatSize(total),
    });
  }

  /**
   * Send one batch in one request (the server stores a request all or nothing).
   * The body's progress is spread over the files in the order they are encoded.
   */
  function sendBatch(entries, onConflict, before, grandTotal) {
    return new Promise(function (resolve, reject) {
      var data = new FormData();
      entries.forEach(function (entry) {
        data.append("files", entry.file, entry.file.name);
      });
      var batchBytes = entries.reduce(function (sum, entry) {
        return sum + entry.file.size;
      }, 0);
      var xhr = new XMLHttpRequest();
      currentRequest = xhr;
      var url = root.getAttribute("data-upload-url") + "?on_conflict=" + encodeURIComponent(onConflict);
      xhr.open("POST", url);
      xhr.setRequestHeader("Accept", "application/json");
      setCsrfHeaders(function (name, value) {
        xhr.setRequestHeader(name, value);
      });
      xhr.upload.addEventListener("progress", function (event) {
        if (!event.lengthComputable) {
          return;
        }
        var sent = Math.min(batchBytes, Math.round((event.loaded / event.total) * batchBytes));
        var offset = 0;
        entries.forEach(function (entry) {
          entry.bar.value = Math.max(0, Math.min(entry.file.size, sent - offset));
          offset += entry.file.size;
        });
        showTotal(before + sent, grandTotal);
      });
      xhr.addEventListener("load", function () {
        currentRequest = null;
        var body = null;
        try {
          body = JSON.parse(xhr.responseText);
        } catch (error) {
          body = null;
        }
        if (xhr.status >= 200 && xhr.status < 300 && body) {
          entries.forEach(function (entry) {
            entry.bar.value = entry.bar.max;
            entry.item.classList.add("done");
          });
          resolve(body);
        } else {
          reject(new Error(problemOf(xhr.status, body)));
        }
      });
      xhr.addEventListener("error", function () {
        currentRequest = null;
        reject(new Error(problemOf(0, null)));
      });
      xhr.addEventListener("abort", function () {
        currentRequest = null;
        reject(new Error("cancelled"));
      });
      xhr.send(data);
    });
  }

  /** Send one large file through tus; its bar and the total follow the server's offset. */
  function sendResumable(entry, onConflict, before, grandTotal) {
    currentRequest = entry;
    return resumable
      .send(entry, onConflict, function (sent) {
        entry.bar.value = sent;
        showTotal(before + sent, grandTotal);
      })
      .then(
        function () {
          currentRequest = null;
          entry.item.classList.add("done");
        },
        function (error) {
          currentRequest = null;
          throw error;
        }
      );
  }

  cancelButton.addEventListener("click", function () {
    cancelled = true;
    if (currentRequest && currentRequest.cancel) {
      currentRequest.cancel();
    } else if (currentRequest) {
      currentRequest.abort();
    }
  });

  function start() {
    if (!pending.length) {
      status.textContent = t("noFiles");
      return;
    }
    if (!check()) {
      uploadButton.hidden = false; // once the problems are removed, send the rest
      problemsBox.focus();
      return; // explained above; nothing is sent
    }
    setBusy(true);
    cancelled = false;
    existingNames()
      .then(function (taken) {
        var conflicts = pending.filter(function (entry) {
          return taken.has(entry.file.name);
        });
        return askConflicts(conflicts);
      })
      .then(function (choices) {
        if (choices === null) {
          setBusy(false);
          uploadButton.hidden = false; // kept in the list: send them once decided
          return null;
        }
        var replaceBatch = [];
        var renameBatch = [];
        var skipped = [];
        var large = [];
        pending.forEach(function (entry) {
          var choice = choices.get(entry) || "replace";
          if (choice === "skip") {
            skipped.push(entry);
          } else if (isResumable(entry)) {
            large.push([entry, choice]);
          } else if (choice === "rename") {
            renameBatch.push(entry);
          } else {
            replaceBatch.push(entry);
          }
        });
        return upload([
          [replaceBatch, "replace"],
          [renameBatch, "rename"],
        ], skipped, large);
      })
      .catch(function (error) {
        setBusy(false);
        status.textContent = t("failed", { detail: error.message });
      });
  }

  function upload(batches, skipped, large) {
    var batchesToSend = batches.filter(function (batch) {
      return batch[0].length > 0;
    });
    var grandTotal = batchesToSend.reduce(function (sum, batch) {
      return (
        sum +
        batch[0].reduce(function (inner, entry) {
          return inner + entry.file.size;
        }, 0)
      );
    }, 0);
    grandTotal += large.reduce(function (sum, pair) {
      return sum + pair[0].file.size;
    }, 0);
    var count =
      large.length +
      batchesToSend.reduce(function (sum, batch) {
        return sum + batch[0].length;
      }, 0);
    var stored = 0;
    var serverSkipped = [];
    var before = 0;
    status.textContent = t("uploading", { count: count });
    showTotal(0, grandTotal);
    skipped.forEach(function (entry) {
      entry.item.classList.add("done");
    });

    var chain = Promise.resolve();
    batchesToSend.forEach(function (batch) {
      chain = chain.then(function () {
        if (cancelled) {
          throw new Error("cancelled");
        }
        return sendBatch(batch[0], batch[1], before, grandTotal).then(function (body) {
          before += batch[0].reduce(function (sum, entry) {
            return sum + entry.file.size;
          }, 0);
          stored += (body.files || []).length;
          serverSkipped = serverSkipped.concat(body.skipped_files || []);
        });
      });
    });
    large.forEach(function (pair) {
      chain = chain.then(function () {
        if (cancelled) {
          throw new Error("cancelled");
        }
        return sendResumable(pair[0], pair[1], before, grandTotal).then(function () {
          before += pair[0].file.size;
          stored += 1;
        });
      });
    });
    return chain
      .then(function () {
        var message = t("uploaded", { count: stored });
        var skippedNames = skipped
          .map(function (entry) {
            return entry.file.name;
          })
          .concat(serverSkipped);
        if (skippedNames.length) {
          message += " " + t("skipped", { names: skippedNames.join(", ") });
        }
        finish(message);
      })
      .catch(function (error) {
        if (error.message === "cancelled") {
          finish(t("cancelled"));
        } else {
          finish(t("failed", { detail: error.message }), true);
        }
      });
  }

  function finish(message, keepQueue) {
    setBusy(false);
    if (reviewBox && !reviewFirst()) {
      uploadButton.hidden = !keepQueue; // a failed batch can be sent again
    }
    if (!keepQueue) {
      pending = [];
      render();
    }
    refreshList().then(function () {
      status.textContent = message;
    });
    status.textContent = message;
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    if (!busy) {
      start();
    }
  });
}

init();
