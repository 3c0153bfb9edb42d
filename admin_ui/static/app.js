// tiergate admin dashboard: the little behaviour the pages need, without inline scripts
// (the Content-Security-Policy allows scripts from /ui/static only).
(function () {
  "use strict";

  function csrfToken() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  // htmx requests carry the session's CSRF token as a header (every POST needs it).
  document.addEventListener("htmx:configRequest", function (event) {
    var token = csrfToken();
    if (token) {
      event.detail.headers["x-csrf-token"] = token;
    }
  });

  // A live panel whose poll fails keeps its last numbers and says so.
  document.addEventListener("htmx:responseError", function (event) {
    var target = event.detail.target;
    if (target && target.hasAttribute("data-live")) {
      target.setAttribute("data-stale", "true");
    }
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail.target;
    if (target && target.hasAttribute("data-live")) {
      target.removeAttribute("data-stale");
    }
  });

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  }, true);

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("a[data-back]");
    if (link && window.history.length > 1) {
      event.preventDefault();
      window.history.back();
    }
    var copy = event.target.closest && event.target.closest("button[data-copy]");
    if (copy) {
      var source = document.getElementById(copy.getAttribute("data-copy"));
      if (source && navigator.clipboard) {
        navigator.clipboard.writeText(source.textContent.trim()).then(function () {
          copy.textContent = "Copied";
        });
      }
    }
  });
})();
