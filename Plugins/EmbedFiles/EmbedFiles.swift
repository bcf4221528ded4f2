import Foundation
import PackagePlugin

/// Compiles directories of text files into the target that applies this plugin, so a binary
/// carries them (no files to install, nothing fetched at build time).
///
/// Generic: every `NAME.embed` file in the target's directory names one directory (a path
/// relative to that `.embed` file, on its first line); the plugin generates `NAME.swift` with
/// `public enum NAME { public static let files: [String: String] }`, keyed by file name, the
/// contents as raw string literals (fast to compile, unlike byte-array literals). Hidden files
/// are skipped; subdirectories are not descended into. Exclude the `.embed` file from the
/// target's sources in Package.swift.
///
/// A `NAME.gitcommit` file names a repository root instead: the plugin generates
/// `public enum NAME { public static let commit: String }` with the commit checked out there
/// ("unknown" outside a git checkout), rebuilt when HEAD moves.
@main
struct EmbedFiles: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) async throws -> [Command] {
        guard let module = target as? SourceModuleTarget else { return [] }
        // `directoryURL` needs tools 6.1; the package is 6.0.
        let dir = URL(fileURLWithPath: String(describing: module.directory))
        let fm = FileManager.default
        let tool = try context.tool(named: "embed-files")
        var commands: [Command] = []
        for name in try fm.contentsOfDirectory(atPath: dir.path).sorted() where name.hasSuffix(".embed") {
            let manifest = dir.appendingPathComponent(name)
            let enumName = String(name.dropLast(".embed".count))
            let text = try String(contentsOf: manifest, encoding: .utf8)
            guard let line = text.split(whereSeparator: \.isNewline).first.map({ $0.trimmingCharacters(in: .whitespaces) }), !line.isEmpty else {
                throw EmbedError("\(manifest.path): the first line must name a directory")
            }
            let source = URL(fileURLWithPath: line, relativeTo: dir).standardizedFileURL
            var inputs: [URL] = []
            for file in try fm.contentsOfDirectory(atPath: source.path).sorted() where !file.hasPrefix(".") {
                let url = source.appendingPathComponent(file)
                var isDir: ObjCBool = false
                if fm.fileExists(atPath: url.path, isDirectory: &isDir), !isDir.boolValue { inputs.append(url) }
            }
            let output = context.pluginWorkDirectoryURL.appendingPathComponent("\(enumName).swift")
            // The directory itself is an input too (its modification time moves when a file is
            // added), and the tool lists it when it runs: a new file is embedded even though
            // SwiftPM does not plan the build again. (After removing a file, touch Package.swift:
            // the old plan still lists it as an input.)
            commands.append(.buildCommand(
                displayName: "Embedding \(source.path.split(separator: "/").last ?? "") as \(enumName)",
                executable: tool.url,
                arguments: [enumName, output.path, source.path],
                inputFiles: inputs + [manifest, source],
                outputFiles: [output]))
        }
        for name in try fm.contentsOfDirectory(atPath: dir.path).sorted() where name.hasSuffix(".gitcommit") {
            let manifest = dir.appendingPathComponent(name)
            let enumName = String(name.dropLast(".gitcommit".count))
            let text = try String(contentsOf: manifest, encoding: .utf8)
            let root = URL(fileURLWithPath: text.split(whereSeparator: \.isNewline).first.map(String.init) ?? "..", relativeTo: dir).standardizedFileURL
            let (commit, watched) = GitCommit.read(root: root)
            let output = context.pluginWorkDirectoryURL.appendingPathComponent("\(enumName).swift")
            commands.append(.buildCommand(
                displayName: "Recording the commit of \(root.lastPathComponent) as \(enumName)",
                executable: tool.url,
                arguments: ["--commit", enumName, output.path, commit],
                inputFiles: watched + [manifest],
                outputFiles: [output]))
        }
        return commands
    }
}

/// The commit checked out in a repository, read from its files (no git needed): HEAD, the
/// branch it names (loose or packed), a worktree's `gitdir`/`commondir`.
enum GitCommit {
    static func read(root: URL) -> (commit: String, watched: [URL]) {
        let fm = FileManager.default
        var gitDir = root.appendingPathComponent(".git")
        var isDir: ObjCBool = false
        guard fm.fileExists(atPath: gitDir.path, isDirectory: &isDir) else { return ("unknown", []) }
        if !isDir.boolValue, let text = try? String(contentsOf: gitDir, encoding: .utf8), text.hasPrefix("gitdir:") {
            let path = text.dropFirst("gitdir:".count).trimmingCharacters(in: .whitespacesAndNewlines)
            gitDir = URL(fileURLWithPath: path, relativeTo: root).standardizedFileURL
        }
        var common = gitDir
        if let text = try? String(contentsOf: gitDir.appendingPathComponent("commondir"), encoding: .utf8) {
            common = URL(fileURLWithPath: text.trimmingCharacters(in: .whitespacesAndNewlines), relativeTo: gitDir.appendingPathComponent("x")).standardizedFileURL
        }
        let head = gitDir.appendingPathComponent("HEAD")
        guard let headText = try? String(contentsOf: head, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines) else {
            return ("unknown", [])
        }
        guard headText.hasPrefix("ref:") else { return (headText, [head]) }
        let ref = headText.dropFirst(4).trimmingCharacters(in: .whitespaces)
        for base in [gitDir, common] {
            let loose = base.appendingPathComponent(ref)
            if let hash = try? String(contentsOf: loose, encoding: .utf8) {
                return (hash.trimmingCharacters(in: .whitespacesAndNewlines), [head, loose])
            }
        }
        let packed = common.appendingPathComponent("packed-refs")
        if let text = try? String(contentsOf: packed, encoding: .utf8) {
            for line in text.split(whereSeparator: \.isNewline) where line.hasSuffix(" " + ref) {
                return (String(line.prefix { $0 != " " }), [head, packed])
            }
        }
        return ("unknown", [head])
    }
}

struct EmbedError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}
