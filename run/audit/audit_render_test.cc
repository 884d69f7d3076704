// report.html looked at as a person would (docs/audit.md): `attest audit --quick` on
// cpu/mxfp8-cudnn, then the page is validated as XML (xmllint: polyglot markup, so every tag
// closes and every attribute is quoted), checked to be self-contained (no script, no network
// reference), laid out by headless Chromium (a copy with a measuring script reports each
// chart's box), and screenshotted; in the PNG every chart's box must hold its data colours and
// not be blank. Exit 77 (ctest SKIP_RETURN_CODE) only when no Chromium is installed.
//
// Usage: audit_render_test ATTEST_CLI XMLLINT [CHROMIUM]
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

int failures = 0;

void Expect(bool ok, const std::string& what) {
  if (!ok) {
    std::cerr << "FAIL: " << what << "\n";
    ++failures;
  }
}

std::string Read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Runs a shell command, returning its exit status and stdout.
int Run(const std::string& cmd, std::string* out = nullptr) {
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return -1;
  std::string text;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) text.append(buf.data(), n);
  const int status = pclose(f);
  if (out) *out = std::move(text);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string FindChromium(int argc, char** argv) {
  if (argc > 3 && argv[3][0] != '\0') return argv[3];
  if (const char* env = std::getenv("ATTEST_CHROMIUM")) return env;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    std::string path;
    if (Run(std::string("command -v ") + name, &path) == 0 && !path.empty()) {
      while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
      return path;
    }
  }
  return {};
}

// ---- A PNG reader for what Chromium writes: 8-bit RGB / RGBA, not interlaced (PNG spec,
// ISO/IEC 15948 §7-§9: chunks, zlib stream, per-row filters 0-4). ----
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3
  std::array<int, 3> At(int x, int y) const {
    const size_t i = (static_cast<size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

uint32_t Be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

bool DecodePng(const std::string& file, Image& img, std::string& why) {
  if (file.size() < 8 || file.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) {
    why = "not a PNG";
    return false;
  }
  int depth = 0, color = 0, interlace = 0;
  std::string idat;
  for (size_t at = 8; at + 8 <= file.size();) {
    const uint32_t len = Be32(file, at);
    const std::string type = file.substr(at + 4, 4);
    if (at + 12 + len > file.size()) break;
    if (type == "IHDR") {
      img.width = static_cast<int>(Be32(file, at + 8));
      img.height = static_cast<int>(Be32(file, at + 12));
      depth = uint8_t(file[at + 16]);
      color = uint8_t(file[at + 17]);
      interlace = uint8_t(file[at + 20]);
    } else if (type == "IDAT") {
      idat += file.substr(at + 8, len);
    }
    at += 12 + len;
  }
  if (depth != 8 || (color != 2 && color != 6) || interlace != 0) {
    why = "unsupported PNG layout (depth " + std::to_string(depth) + ", colour type " +
          std::to_string(color) + ")";
    return false;
  }
  const int bpp = color == 6 ? 4 : 3;
  const size_t stride = static_cast<size_t>(img.width) * bpp;
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()),
                 idat.size()) != Z_OK ||
      raw_len != raw.size()) {
    why = "zlib stream does not inflate to the image size";
    return false;
  }
  std::vector<uint8_t> prev(stride, 0), cur(stride);
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  for (int y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* src = &raw[y * (stride + 1) + 1];
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= static_cast<size_t>(bpp) ? cur[i - bpp] : 0;
      const int b = prev[i];
      const int c = i >= static_cast<size_t>(bpp) ? prev[i - bpp] : 0;
      int pred = 0;
      switch (filter) {
        case 0: pred = 0; break;
        case 1: pred = a; break;
        case 2: pred = b; break;
        case 3: pred = (a + b) / 2; break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b),
                    pc = std::abs(p - c);
          pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
          break;
        }
        default: why = "bad filter type"; return false;
      }
      cur[i] = static_cast<uint8_t>(src[i] + pred);
    }
    for (int x = 0; x < img.width; ++x) {
      for (int ch = 0; ch < 3; ++ch) {
        img.rgb[(static_cast<size_t>(y) * img.width + x) * 3 + ch] = cur[x * bpp + ch];
      }
    }
    std::swap(prev, cur);
  }
  return true;
}

std::array<int, 3> Hex(const std::string& h) {
  return {std::stoi(h.substr(1, 2), nullptr, 16), std::stoi(h.substr(3, 2), nullptr, 16),
          std::stoi(h.substr(5, 2), nullptr, 16)};
}

struct Box {
  double x = 0, y = 0, w = 0, h = 0;
};

// 1. The audit, as a person runs it. Exit 0 or 1 both write the reports; 2 is a fault.
// Writes report.html, report.md and report.json into dir.
void RunAuditCli(const std::string& cli, const fs::path& dir) {
  const std::string audit = Quote(cli) + " audit --kernel cpu/mxfp8-cudnn --quick --out " +
                            Quote(dir.string()) + " > " + Quote((dir / "audit.log").string()) +
                            " 2>&1";
  const int rc = Run(audit);
  Expect(rc == 0 || rc == 1, "attest audit exit code " + std::to_string(rc) + "\n" +
                                 Read(dir / "audit.log"));
  for (const char* f : {"report.html", "report.md", "report.json"}) {
    Expect(fs::exists(dir / f) && fs::file_size(dir / f) > 0, std::string(f) + " written");
  }
}

// 2. Valid markup (strict XML parse of the polyglot page) and self-contained.
void CheckMarkup(const std::string& xmllint, const fs::path& html_path,
                 const std::string& html) {
  Expect(Run(Quote(xmllint) + " --noout " + Quote(html_path.string()) + " 2>&1") == 0,
         "report.html parses as XML (xmllint --noout)");
  Expect(html.find("<script") == std::string::npos, "report.html has no script");
  for (const std::regex& ref : {std::regex(R"((src|href)\s*=\s*"(?!#))"),
                                std::regex(R"(url\(\s*['"]?(?!#)[a-z]+:)")}) {
    Expect(!std::regex_search(html, ref), "report.html references nothing outside itself");
  }
}

// 3. The charts the page must show (a kernel with a backward: o, dq, dk, dv everywhere).
// Returns each chart's data-colors by id.
std::map<std::string, std::string> ChartColors(const std::string& html) {
  std::map<std::string, std::string> colors;  // id -> data-colors
  const std::regex svg_re(R"re(<svg [^>]*id="([^"]+)" class="plot"[^>]*data-colors="([^"]*)")re");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), svg_re);
       it != std::sregex_iterator(); ++it) {
    Expect(colors.emplace((*it)[1].str(), (*it)[2].str()).second, "unique id " + (*it)[1].str());
  }
  size_t svg_count = 0;
  for (size_t at = html.find("<svg "); at != std::string::npos; at = html.find("<svg ", at + 1)) {
    ++svg_count;
  }
  Expect(svg_count == colors.size(), "every <svg> is a chart with an id and data-colors");
  std::vector<std::string> expected;
  for (const char* t : {"o", "dq", "dk", "dv"}) {
    for (const char* s : {"seqlen", "headdim", "dist"}) {
      expected.push_back(std::string("plot-") + s + "-" + t);
    }
  }
  for (const char* m : {"o", "dq", "dk-dv"}) {
    expected.push_back(std::string("plot-leak-cpu-mxfp8-cudnn-") + m);
  }
  expected.push_back("plot-bias-signed");
  expected.push_back("plot-bias-magnitude");
  for (const std::string& id : expected) Expect(colors.count(id) == 1, "chart " + id + " present");
  return colors;
}

// 4. Layout: a copy of the page with a measuring script, as Chromium lays it out: each
// chart's box by id, and the page's height. False when a check has failed by then.
bool MeasureCharts(const std::string& chromium, const std::string& flags, int width,
                   const std::string& html, const fs::path& dir,
                   std::map<std::string, Box>* boxes, int* page_height) {
  const std::string measure =
      "<script>const b=[];document.querySelectorAll('svg.plot').forEach(s=>{const "
      "r=s.getBoundingClientRect();b.push(s.id+','+(r.left+scrollX)+','+(r.top+scrollY)+','+"
      "r.width+','+r.height)});const p=document.createElement('pre');p.id='boxes';"
      "p.textContent='BOXES'+b.join(';')+'|'+document.documentElement.scrollHeight+'END';"
      "document.body.appendChild(p);</script>";
  std::string copy = html;
  copy.insert(copy.rfind("</body>"), measure);
  const fs::path copy_path = dir / "measure.html";
  std::ofstream(copy_path) << copy;
  std::string dom;
  Run(Quote(chromium) + flags + " --window-size=" + std::to_string(width) +
          ",1000 --dump-dom file://" + copy_path.string() + " 2>/dev/null",
      &dom);
  // The script's own text holds the markers too: read the <pre> it appended.
  const std::string marker = "<pre id=\"boxes\">BOXES";
  const size_t b0 = dom.find(marker);
  const size_t b1 = b0 == std::string::npos ? b0 : dom.find("END", b0);
  Expect(b0 != std::string::npos && b1 != std::string::npos, "chromium --dump-dom measured boxes");
  if (failures) return false;
  const std::string boxes_text = dom.substr(b0 + marker.size(), b1 - b0 - marker.size());
  const size_t bar = boxes_text.rfind('|');
  *page_height = std::stoi(boxes_text.substr(bar + 1));
  std::stringstream bs(boxes_text.substr(0, bar));
  for (std::string item; std::getline(bs, item, ';');) {
    std::stringstream is(item);
    std::string id, v;
    std::getline(is, id, ',');
    Box b;
    std::getline(is, v, ',');
    b.x = std::stod(v);
    std::getline(is, v, ',');
    b.y = std::stod(v);
    std::getline(is, v, ',');
    b.w = std::stod(v);
    std::getline(is, v, ',');
    b.h = std::stod(v);
    (*boxes)[id] = b;
  }
  return true;
}

// 5. The screenshot of the page itself (no script), one window tall enough for all of it,
// decoded into img. False when a check has failed by then.
bool Screenshot(const std::string& chromium, const std::string& flags, int width,
                int page_height, const fs::path& html_path, const fs::path& dir, Image& img) {
  const fs::path png = dir / "report.png";
  Run(Quote(chromium) + flags + " --window-size=" + std::to_string(width) + "," +
      std::to_string(page_height) + " --screenshot=" + Quote(png.string()) + " file://" +
      html_path.string() + " > /dev/null 2>&1");
  std::string why;
  Expect(fs::exists(png) && DecodePng(Read(png), img, why), "screenshot decodes: " + why);
  return failures == 0;
}

// 6. Every chart: inside the image, not blank, and showing each of its data colours.
void CheckCharts(std::map<std::string, Box>& boxes, std::map<std::string, std::string>& colors,
                 const Image& img) {
  for (const auto& [id, box] : boxes) {
    const int x0 = static_cast<int>(std::ceil(box.x)), y0 = static_cast<int>(std::ceil(box.y));
    const int x1 = static_cast<int>(box.x + box.w) - 1, y1 = static_cast<int>(box.y + box.h) - 1;
    if (x0 < 0 || y0 < 0 || x1 >= img.width || y1 >= img.height || x1 <= x0 || y1 <= y0) {
      Expect(false, id + " lies inside the screenshot");
      continue;
    }
    std::vector<std::array<int, 3>> want;
    std::stringstream cs(colors[id]);
    for (std::string c; std::getline(cs, c, ',');) want.push_back(Hex(c));
    std::vector<int> hits(want.size(), 0);
    int64_t ink = 0, total = 0;
    for (int y = y0; y <= y1; ++y) {
      for (int x = x0; x <= x1; ++x) {
        const auto p = img.At(x, y);
        ++total;
        if (p[0] < 245 || p[1] < 245 || p[2] < 245) ++ink;
        for (size_t k = 0; k < want.size(); ++k) {
          if (std::abs(p[0] - want[k][0]) <= 6 && std::abs(p[1] - want[k][1]) <= 6 &&
              std::abs(p[2] - want[k][2]) <= 6) {
            ++hits[k];
          }
        }
      }
    }
    const double coverage = static_cast<double>(ink) / static_cast<double>(total);
    const bool heatmap = id.rfind("plot-leak-", 0) == 0;
    Expect(coverage > (heatmap ? 0.25 : 0.03),
           id + " is not blank (ink " + std::to_string(coverage) + ")");
    Expect(!want.empty(), id + " declares the colours of its marks");
    for (size_t k = 0; k < want.size(); ++k) {
      Expect(hits[k] >= 15, id + " shows colour #" + std::to_string(k) + " (" +
                                std::to_string(hits[k]) + " pixels)");
    }
  }
}

// 7. The cudnn model leaks by construction: its o map must show leak colours (a band of
// non-green, non-grey cells), i.e. pixels that are neither background, grey nor green.
void CheckLeakBand(std::map<std::string, Box>& boxes, const Image& img) {
  const Box b = boxes["plot-leak-cpu-mxfp8-cudnn-o"];
  int64_t leak_pixels = 0;
  for (int y = static_cast<int>(b.y); y < static_cast<int>(b.y + b.h) && y < img.height; ++y) {
    for (int x = static_cast<int>(b.x); x < static_cast<int>(b.x + b.w); ++x) {
      const auto p = img.At(x, y);
      // The change ramp (YlOrRd) has red well above blue and above green.
      if (p[0] > 90 && p[0] - p[2] > 80 && p[0] - p[1] > 15) ++leak_pixels;
    }
  }
  Expect(leak_pixels > 200, "the o leak map shows the leak (" + std::to_string(leak_pixels) +
                                " leak-coloured pixels)");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: audit_render_test ATTEST_CLI XMLLINT [CHROMIUM]\n";
    return 2;
  }
  const std::string cli = argv[1], xmllint = argv[2];
  const std::string chromium = FindChromium(argc, argv);
  if (chromium.empty()) {
    std::cout << "SKIP: no chromium (Debian package `chromium`, installed by tools/bootstrap)\n";
    return 77;
  }
  const fs::path dir = fs::temp_directory_path() / ("attest-audit-render-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  RunAuditCli(cli, dir);
  const fs::path html_path = dir / "report.html";
  if (failures) return 1;
  const std::string html = Read(html_path);
  CheckMarkup(xmllint, html_path, html);
  std::map<std::string, std::string> colors = ChartColors(html);

  const int width = 1400;
  const std::string flags = " --headless --no-sandbox --disable-gpu --hide-scrollbars "
                            "--force-device-scale-factor=1 --no-first-run --user-data-dir=" +
                            Quote((dir / "profile").string());
  std::map<std::string, Box> boxes;
  int page_height = 0;
  if (!MeasureCharts(chromium, flags, width, html, dir, &boxes, &page_height)) return 1;
  Expect(boxes.size() == colors.size(), "chromium laid out every chart");
  Image img;
  if (!Screenshot(chromium, flags, width, page_height, html_path, dir, img)) return 1;
  Expect(img.width == width, "screenshot width " + std::to_string(img.width));

  CheckCharts(boxes, colors, img);
  CheckLeakBand(boxes, img);
  if (failures == 0) {
    std::cout << "report.html: " << colors.size() << " charts present and drawn ("
              << img.width << "x" << img.height << " screenshot)\n";
    fs::remove_all(dir);
    return 0;
  }
  std::cerr << failures << " failures; files kept in " << dir << "\n";
  return 1;
}
