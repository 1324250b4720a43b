// Package demo plays allot's demo: a story of traffic against the
// regions of the embedded default (allot dev), with a live terminal view
// and a dashboard of charts over time. It is the engine of `allot demo`.
//
// A Story is a list of chapters; each has a duration, the flows of
// requests it sends (a rate per region; Check batches, or LLM token
// reservations that are reserved, held and settled) and the regions it
// cuts off from the coordinator and their peers. DefaultStory is about
// two minutes on the built-in example limits: steady traffic, a demand
// shift from one region to another, a region cut off and healed, and a
// burst of LLM reservations. Story.Scaled plays it faster.
//
// The story, the pacing of rates into requests, the time series and the
// terminal view are plain data and functions of their arguments; Run is
// the driver that reads the clock and talks gRPC:
//
//	links := demo.NewLinks() // TCP relays between the regions, and to the coordinator
//	addr, _ := links.Add("us-east", demo.Coordinator, coordinatorAddr)
//	// ... start the regions dialling the relays' addresses, then
//	links.SetTarget("us-east", usEastGRPCAddr)
//	series := demo.NewSeries(names, story, time.Second, 0)
//	go http.Serve(ln, demo.Dashboard(series)) // GET / and /api/series
//	demo.Run(ctx, demo.Options{Story: story, Regions: regions, Links: links,
//		Series: series, Out: os.Stdout, ANSI: true, Once: true})
//	// every Tick:     story.At(elapsed) → cut/heal regions → send the flows' due requests
//	// every Interval: Admin.Status of every region (shares in force) + the Tally of
//	//                 decisions → Series.Add → redraw the view
//
// Decisions are counted from the answers the demo's traffic gets, per
// region and limit ("domain/limit"), as the enforcers' metrics count
// them; shares are the ones in force in each region (allot.v1.Admin
// Status), so a region that is cut off shows the share it keeps.
//
// Everything here is safe for concurrent use unless a type says
// otherwise.
package demo
