/* Mentions in the chat preview composer: typing @ offers the thread's files.
 *
 * The list is filtered as one types after the @, moved through with the arrow keys and
 * chosen with Enter or Tab (or a click); Escape closes it. Choosing a file ticks its
 * checkbox in the "attach" list, exactly as ticking it by hand would, and takes the typed
 * @word out of the message, so the request sent is the same either way. Names are written
 * with textContent only.
 */
import { t, visible } from "./common.js";

function init() {
  var message = document.querySelector("#compose-form textarea[name='message']");
  var boxes = Array.prototype.slice.call(document.querySelectorAll("#compose-form input[name='attach']"));
  if (!message || !boxes.length) {
    return;
  }
  var list = document.createElement("ul");
  list.id = "mention-list";
  list.className = "mention-list";
  list.setAttribute("role", "listbox");
  list.setAttribute("aria-label", t("mentionLabel"));
  list.hidden = true;
  message.insertAdjacentElement("afterend", list);
  message.setAttribute("role", "combobox");
  message.setAttribute("aria-autocomplete", "list");
  message.setAttribute("aria-controls", list.id);
  message.setAttribute("aria-expanded", "false");

  var matches = [];
  var active = 0;
  var token = null; // {start, end} of the @word being typed

  function currentToken() {
    var caret = message.selectionStart;
    if (caret !== message.selectionEnd) {
      return null;
    }
    var before = message.value.slice(0, caret);
    var found = /(^|\s)@([^\s@]*)$/.exec(before);
    if (!found) {
      return null;
    }
    return { start: caret - found[2].length - 1, end: caret, query: found[2] };
  }

  function close() {
    list.hidden = true;
    list.replaceChildren();
    message.setAttribute("aria-expanded", "false");
    message.removeAttribute("aria-activedescendant");
    token = null;
  }

  function render() {
    list.replaceChildren();
    matches.forEach(function (box, index) {
      var item = document.createElement("li");
      item.id = "mention-option-" + index;
      item.setAttribute("role", "option");
      item.setAttribute("aria-selected", index === active ? "true" : "false");
      item.className = "mention-option" + (index === active ? " active" : "");
      item.textContent = visible(box.value);
      if (box.checked) {
        var mark = document.createElement("span");
        mark.className = "hint";
        mark.textContent = " " + t("mentionAttached");
        item.appendChild(mark);
      }
      item.addEventListener("mousedown", function (event) {
        event.preventDefault(); // keep the focus in the message
        choose(index);
      });
      list.appendChild(item);
    });
    list.hidden = matches.length === 0;
    message.setAttribute("aria-expanded", matches.length ? "true" : "false");
    if (matches.length) {
      message.setAttribute("aria-activedescendant", "mention-option-" + active);
    } else {
      message.removeAttribute("aria-activedescendant");
    }
  }

  function update() {
    token = currentToken();
    if (!token) {
      close();
      return;
    }
    var needle = token.query.toLocaleLowerCase();
    matches = boxes.filter(function (box) {
      return box.value.toLocaleLowerCase().indexOf(needle) !== -1;
    });
    active = 0;
    render();
  }

  function choose(index) {
    var box = matches[index];
    if (!box || !token) {
      return;
    }
    if (!box.checked) {
      box.click(); // the same as ticking it: change events and all
    }
    var value = message.value;
    var after = value.slice(token.end).replace(/^ /, "");
    var before = value.slice(0, token.start).replace(/ $/, "");
    var joiner = before && after ? " " : "";
    message.value = before + joiner + after;
    var caret = before.length + joiner.length;
    message.setSelectionRange(caret, caret);
    close();
    message.focus();
  }

  message.addEventListener("input", update);
  message.addEventListener("click", update);
  message.addEventListener("blur", close);
  message.addEventListener("keydown", function (event) {
    if (list.hidden || !matches.length) {
      return;
    }
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      active = (active + (event.key === "ArrowDown" ? 1 : matches.length - 1)) % matches.length;
      render();
    } else if (event.key === "Enter" || event.key === "Tab") {
      event.preventDefault();
      choose(active);
    } else if (event.key === "Escape") {
      event.preventDefault();
      close();
    }
  });
}

init();
