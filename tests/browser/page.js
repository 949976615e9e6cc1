// Helpers installed in every JupyterLab page (window.minipaged); test_browser.py calls them.
// Every query is scoped to the notebook panel on screen.
window.minipaged = {
  panel() {
    return document.querySelector(".jp-NotebookPanel:not(.lm-mod-hidden)");
  },

  // The toolbar's indicator also reads "idle" while the notebook has no kernel yet (Run All
  // would then do nothing): require a kernel name and the status bar's "| Idle" as well.
  kernelIdle() {
    const panel = this.panel();
    const name = panel?.querySelector(".jp-KernelName")?.innerText.trim() ?? "";
    return panel?.querySelector(".jp-Notebook-ExecutionIndicator")?.getAttribute("data-status") === "idle" &&
      name !== "" && name !== "No Kernel" &&
      /\| Idle\b/.test(document.querySelector("#jp-main-statusbar")?.innerText ?? "");
  },

  // [prompt, first source line] of each code cell with source ("" cells never get a number).
  codeCells() {
    return Array.from(this.panel().querySelectorAll(".jp-CodeCell"))
      .map((cell) => [
        cell.querySelector(".jp-InputArea-prompt")?.innerText.trim() ?? "",
        (cell.querySelector(".cm-content")?.innerText ?? "").trim().split("\n")[0],
      ])
      .filter(([, source]) => source !== "");
  },

  // Error outputs, tracebacks on stderr and widgets that failed to display.
  errors() {
    const found = [];
    for (const out of this.panel().querySelectorAll(".jp-OutputArea-output")) {
      const text = out.innerText ?? "";
      const stderr = out.getAttribute("data-mime-type") === "application/vnd.jupyter.stderr";
      if ((stderr && /Traceback|Error/.test(text)) || /Error displaying widget/.test(text)) {
        found.push(text.slice(0, 1500));
      }
    }
    return found;
  },

  // All the notebook's cells are in the DOM with their editors, and the kernel has started.
  ready(numCells) {
    const panel = this.panel();
    if (!panel || !this.kernelIdle()) return false;
    return panel.querySelectorAll(".jp-Cell").length === numCells &&
      panel.querySelectorAll(".jp-Cell .cm-content").length === numCells;
  },

  // Some code cell is queued, running or done.
  runStarted() {
    return this.codeCells().some(([prompt]) => /\*|\d/.test(prompt));
  },

  // Run All finished: nothing queued or running, the kernel idle, every cell numbered or an error shown.
  runFinished() {
    const cells = this.codeCells();
    if (cells.length === 0 || cells.some(([prompt]) => prompt.includes("*")) || !this.kernelIdle()) return false;
    return cells.every(([prompt]) => /\[\d+\]/.test(prompt)) || this.errors().length > 0;
  },

  state() {
    return JSON.stringify({
      kernelIdle: this.kernelIdle(),
      notRun: this.codeCells().filter(([p]) => !/\[\d+\]/.test(p)),
      errors: this.errors(),
    }).slice(0, 4000);
  },

  // Images of ipywidgets Image views (the outputs' plain <img> are static pictures).
  widgetImages(root) {
    return Array.from(root.querySelectorAll("img.widget-image, .widget-image img"));
  },

  // Mark the first slider's handle and the widget images nearest to it (its own box, else its
  // cell, else the whole notebook) with data attributes that the test can address.
  markFirstSlider() {
    const slider = this.panel().querySelector(".widget-slider");
    if (!slider) return null;
    slider.querySelector(".noUi-handle").setAttribute("data-minipaged", "slider");
    let images = [];
    for (let el = slider.parentElement; el && images.length === 0; el = el.parentElement) {
      images = this.widgetImages(el);
      if (el.classList.contains("jp-Notebook")) break;
    }
    images.forEach((img, i) => img.setAttribute("data-minipaged", `image-${i}`));
    return {
      label: slider.querySelector(".widget-label")?.innerText ?? "",
      readout: slider.querySelector(".widget-readout")?.innerText ?? "",
      images: images.length,
    };
  },

  readout() {
    const handle = document.querySelector('[data-minipaged="slider"]');
    return handle?.closest(".widget-slider")?.querySelector(".widget-readout")?.innerText ?? "";
  },

  // SHA-256 of the bytes behind each marked image (a blob: or data: URL).
  async imageDigests() {
    const images = Array.from(document.querySelectorAll('[data-minipaged^="image-"]'));
    return Promise.all(images.map(async (img) => {
      const bytes = await (await fetch(img.src)).arrayBuffer();
      const digest = await crypto.subtle.digest("SHA-256", bytes);
      return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
    }));
  },

  // How the outermost widget boxes fit the notebook: what reaches past the output area's right
  // edge (and whether the output scrolls sideways), labels cut short, slider tracks under 60 px.
  widgetFit() {
    const rect = (el) => el.getBoundingClientRect();
    const notebookRight = rect(this.panel().querySelector(".jp-Notebook")).right;
    const boxes = Array.from(this.panel().querySelectorAll(".jp-OutputArea-output .widget-box"))
      .filter((box) => !box.parentElement.closest(".widget-box"));
    return boxes.map((box) => {
      const output = box.closest(".jp-OutputArea-output");
      const right = Math.min(rect(output).right, notebookRight);
      const problems = [];
      for (const el of box.querySelectorAll("*")) {
        const over = Math.round(rect(el).right - right);
        // > 2 px: an Image of width 100% sticks out by its 2 px margin, an ipywidgets default.
        if (rect(el).width > 0 && over > 2 && !el.parentElement.closest("[data-minipaged-over]")) {
          el.setAttribute("data-minipaged-over", "");
          problems.push(`${String(el.className.baseVal ?? el.className).split(" ").pop()} ${over} px past the edge`);
        }
      }
      box.querySelectorAll("[data-minipaged-over]").forEach((el) => el.removeAttribute("data-minipaged-over"));
      if (output.scrollWidth > output.clientWidth) problems.push("the output scrolls sideways");
      for (const el of box.querySelectorAll(".widget-label, .widget-readout, .widget-html-content")) {
        if (el.scrollWidth > el.clientWidth + 1) {
          problems.push(`"${el.innerText.slice(0, 40)}" cut: ${el.clientWidth} of ${el.scrollWidth} px`);
        }
      }
      for (const el of box.querySelectorAll(".noUi-target")) {
        const label = el.closest(".widget-slider")?.querySelector(".widget-label")?.innerText ?? "";
        if (rect(el).width < 60) problems.push(`slider "${label}" track ${Math.round(rect(el).width)} px`);
      }
      const first = box.querySelector(".widget-label")?.innerText ?? box.innerText;
      return { box: first.slice(0, 30), problems };
    });
  },
};
